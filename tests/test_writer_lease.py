"""One writer per run (issue 23 point 3): the job saving into a URL holds its writer lease;
another live job starting to save there is refused with an error naming it; a stale lease
(no heartbeat, or its process gone from this machine) is taken over; DIST_RESUME_TAKE_OVER=1
takes over a live one; on S3 the lease is created with a conditional write. Jobs are real
processes (tests/lease_job.py)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dist_resume import save_checkpoint
from dist_resume.checkpoint import lease
from dist_resume.checkpoint.lease_holder import Holder
from dist_resume.errors import CheckpointError
from dist_resume.storage import open_store, resolve
from tests import lease_job, rank_agreement_worker
from tests.checkpoint_worker import run
from tests.s3_server import free_port

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def _refused(url: str, host: str, pid: int, stale_after: str = "120") -> str:
    return (f"^{re.escape(f'cannot save to {url}: another job is writing there (host {host}, pid {pid}, started ')}"
            f"{TIME}, last heartbeat {TIME}, \\d+ s ago\\); "
            + re.escape("one job writes to a run at a time: stop that job, or wait until its lease is stale (no "
                        f"heartbeat for {stale_after} s), or set DIST_RESUME_TAKE_OVER=1 to take it over now") + "$")


def _leases(url: str) -> list[str]:
    return sorted(name for name in os.listdir(url) if name.startswith(".writer_lease_"))


def _save(url: str, step: int) -> None:
    save_checkpoint({"w": torch.full((2,), float(step))}, url, step)


def _start(url: str, handshake: Path, then: str, **env: str) -> subprocess.Popen:
    handshake.mkdir()
    args = {"url": url, "handshake": str(handshake), "then": then}
    job = subprocess.Popen([sys.executable, lease_job.__file__, json.dumps(args)], env={**os.environ, **env},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (handshake / "ready").exists():
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            raise AssertionError(f"the job did not save (exit code {job.poll()}): {job.communicate()[0].decode()}")
        time.sleep(0.01)
    return job


def _write_lease(url: str, generation: int, heartbeat_age: float, host: str = "another-host", pid: int = 4242,
                 job: str = "") -> None:
    now = time.time()
    holder = Holder("f" * 32, host, pid, "", now - 3600, now - heartbeat_age, 30.0, job)
    Path(url, f".writer_lease_{generation}").write_bytes(holder.encode())


@pytest.mark.slow
def test_a_second_job_on_the_url_is_refused_until_the_first_exits(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    first = _start(url, tmp_path / "handshake", "exit")
    try:
        with pytest.raises(CheckpointError, match=_refused(url, socket.gethostname(), first.pid)):
            _save(url, 2)
        (tmp_path / "handshake" / "go").write_text("")
        assert first.wait(timeout=120) == 0, first.communicate()[0].decode()
    finally:
        first.kill()
    assert _leases(url) == []  # released at its clean exit
    _save(url, 2)
    assert _leases(url) == [".writer_lease_0"]


@pytest.mark.slow
def test_the_lease_of_a_killed_job_is_taken_over_at_once(tmp_path: Path) -> None:
    """kill -9 leaves the lease behind with a fresh heartbeat; its process is gone from this
    machine, so a restart takes it over without waiting for it to go stale."""
    url = str(tmp_path / "run")
    first = _start(url, tmp_path / "handshake", "exit")
    first.kill()
    first.wait()
    assert _leases(url) == [".writer_lease_0"]
    _save(url, 2)
    assert _leases(url) == [".writer_lease_1"]


@pytest.mark.slow
def test_every_rank_of_a_refused_job_fails_together(tmp_path: Path) -> None:
    """Only rank 0 takes the lease; rank 1 learns the refusal in the save's collective."""
    url = str(tmp_path / "run")
    _save(url, 1)  # this test's process holds the lease
    out = tmp_path / "out"
    run("leased_elsewhere", 2, {"out": str(out), "url": url}, free_port(), script=rank_agreement_worker.__file__)
    errors = [(out / f"leased-error-{rank}.txt").read_text() for rank in (0, 1)]
    assert errors[0] == errors[1]
    assert re.match(_refused(url, socket.gethostname(), os.getpid()), errors[0].removeprefix("CheckpointError: "))
    assert not os.path.exists(os.path.join(url, "step_00000005"))


def test_a_stale_lease_is_taken_over_and_a_live_one_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    os.makedirs(url)
    _write_lease(url, 0, heartbeat_age=121)  # 4 refresh periods of 30 s and more: stale
    _save(url, 1)
    assert _leases(url) == [".writer_lease_1"]
    other = str(tmp_path / "other")
    os.makedirs(other)
    _write_lease(other, 3, heartbeat_age=119)
    with pytest.raises(CheckpointError, match=_refused(other, "another-host", 4242)):
        _save(other, 1)
    assert not os.path.exists(os.path.join(other, "step_00000001"))


@pytest.mark.parametrize("run_id", ["run-7", "none"])
def test_the_same_torchrun_job_takes_its_lease_back_after_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    run_id: str) -> None:
    """torchrun restarted the job's workers, rank 0 now on another node: the lease of the same
    run id is its own. torchrun's default id "none" names no job."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    _write_lease(url, 0, heartbeat_age=1, job=run_id)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
    if run_id == "none":
        with pytest.raises(CheckpointError, match=_refused(url, "another-host", 4242)):
            _save(url, 1)
        return
    _save(url, 1)
    assert _leases(url) == [".writer_lease_1"]


def test_a_live_lease_of_a_later_version_is_still_refused(tmp_path: Path) -> None:
    """A field this version does not know does not make a live lease look damaged."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    now = time.time()
    record = json.loads(Holder("f" * 32, "another-host", 4242, "", now, now, 30.0).encode())
    Path(url, ".writer_lease_0").write_text(json.dumps({**record, "added_later": [1, 2]}))
    with pytest.raises(CheckpointError, match=_refused(url, "another-host", 4242)):
        _save(url, 1)


def test_a_lease_record_that_names_no_job_is_taken_over(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    os.makedirs(url)
    Path(url, ".writer_lease_0").write_text("not a lease")
    _save(url, 1)
    assert _leases(url) == [".writer_lease_1"]


@pytest.mark.slow
def test_take_over_a_live_lease_and_the_old_writer_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DIST_RESUME_TAKE_OVER=1 takes the lease of a live job; that job's next heartbeat finds
    the takeover, and its saves are refused from then on, naming the job that took over."""
    url = str(tmp_path / "run")
    first = _start(url, tmp_path / "handshake", "save_until_refused", DIST_RESUME_LEASE_REFRESH="0.2")
    try:
        monkeypatch.setenv("DIST_RESUME_TAKE_OVER", "1")
        _save(url, 100)
        (tmp_path / "handshake" / "go").write_text("")
        assert first.wait(timeout=150) == 0, first.communicate()[0].decode()
    finally:
        first.kill()
    outcome = (tmp_path / "handshake" / "outcome").read_text()
    expected = (re.escape(f"cannot save to {url}: another job took over this run's writer lease (host "
                          f"{socket.gethostname()}, pid {os.getpid()}, started ")
                + f"{TIME}, last heartbeat {TIME}, \\d+ s ago" + re.escape("); this job no longer writes there"))
    assert re.fullmatch(expected, outcome), outcome
    assert _leases(url) == [".writer_lease_1"]


def test_the_refresh_period_must_be_a_positive_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIST_RESUME_LEASE_REFRESH", "soon")
    with pytest.raises(CheckpointError, match="^DIST_RESUME_LEASE_REFRESH='soon' is not a number of seconds above 0$"):
        _save(str(tmp_path / "run"), 1)


def test_on_s3_two_jobs_creating_the_lease_at_once_give_one_writer(s3_bucket: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Both jobs saw no lease; the other job's conditional PUT (If-None-Match) came first, so
    this one's fails, and it is refused naming that job."""
    url = f"{s3_bucket}/run"
    store = open_store(resolve(url))
    now = time.time()
    theirs = Holder("e" * 32, "another-host", 77, "", now, now, 30.0)
    seen = []

    def stale_view(store):  # the listing this job read before the other job created its lease
        seen.append(True)
        return [] if len(seen) == 1 else real(store)

    real = lease._generations
    assert store.create_exclusive(store.loc.join(".writer_lease_0"), theirs.encode())
    monkeypatch.setattr(lease, "_generations", stale_view)
    with pytest.raises(CheckpointError, match=_refused(url, "another-host", 77)):
        _save(url, 1)
    assert store.loc.fs.cat_file(store.loc.join(".writer_lease_0")) == theirs.encode()
    monkeypatch.setattr(lease, "_generations", real)
    theirs = Holder("e" * 32, "another-host", 77, "", now - 600, now - 600, 30.0)
    store.overwrite(store.loc.join(".writer_lease_0"), theirs.encode())
    _save(url, 1)  # stale now: taken over
    names = sorted(name.rsplit("/", 1)[1] for name in store.loc.fs.ls(store.loc.root))
    assert names == [".commits", ".writer_lease_1", "step_00000001"]


def test_one_process_saves_to_one_run_under_any_spelling_of_its_url(tmp_path: Path) -> None:
    """A plain path, a file:// URL and a path through a link name one local run: the process
    holding its lease is the same job, not a second writer."""
    run_dir = tmp_path / "run"
    (tmp_path / "link").symlink_to(tmp_path, target_is_directory=True)
    save_checkpoint({"w": torch.ones(2)}, str(run_dir), 1)
    save_checkpoint({"w": torch.ones(2)}, f"file://{run_dir}", 2)
    save_checkpoint({"w": torch.ones(2)}, str(tmp_path / "link" / "run"), 3)
    assert sorted(path.name for path in run_dir.iterdir() if path.name.startswith(".writer_lease")) == [
        ".writer_lease_0"]
