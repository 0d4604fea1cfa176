"""One writer per run (issue 23 point 3): the job saving into a URL holds its writer lease;
another live job starting to save there is refused with an error naming it; a stale lease
(seen without a heartbeat, or its process gone from this machine) is taken over;
DIST_RESUME_TAKE_OVER=1 takes over a live one; on S3 the lease is created with a conditional
write. Jobs are real processes (tests/lease_job.py), or records written as theirs
(tests/lease_records.py)."""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path

import pytest
import torch

from dist_resume import list_checkpoints, save_checkpoint
from dist_resume.checkpoint.lease import release_all
from dist_resume.checkpoint.lease_files import LeaseFiles
from dist_resume.errors import CheckpointError
from dist_resume.storage import open_store, resolve
from tests import lease_job, rank_agreement_worker
from tests.checkpoint_worker import run
from tests.lease_records import TIME, beating, leases, record, refused, write_record
from tests.s3_server import free_port

def _save(url: str, step: int) -> None:
    save_checkpoint({"w": torch.full((2,), float(step))}, url, step)


@pytest.mark.slow
def test_a_second_job_on_the_url_is_refused_until_the_first_exits(tmp_path: Path) -> None:
    """Refused at the first job's next heartbeat (every 0.2 s); taken at once once it ended."""
    url = str(tmp_path / "run")
    first = lease_job.start(url, tmp_path / "handshake", "exit", DIST_RESUME_LEASE_REFRESH="0.2")
    try:
        with pytest.raises(CheckpointError, match="^" + refused(url, socket.gethostname(), first.pid, "0",
                                                                stale_after="0.8") + "$"):
            _save(url, 2)
        (tmp_path / "handshake" / "go").write_text("")
        assert first.wait(timeout=120) == 0, first.communicate()[0].decode()
    finally:
        first.kill()
    assert json.loads(Path(url, ".writer_lease_0").read_bytes())["released"] is True  # at its clean exit
    _save(url, 2)
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]


@pytest.mark.slow
def test_the_lease_of_a_killed_job_is_taken_over_at_once(tmp_path: Path) -> None:
    """kill -9 leaves the lease behind with a fresh heartbeat; its process is gone from this
    machine, so a restart takes it over without waiting for it to go stale."""
    url = str(tmp_path / "run")
    first = lease_job.start(url, tmp_path / "handshake", "exit")
    first.kill()
    first.wait()
    assert leases(url) == [".writer_lease_0"]
    _save(url, 2)
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]


@pytest.mark.slow
def test_every_rank_of_a_refused_job_fails_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only rank 0 takes the lease; rank 1 learns the refusal in the save's collective."""
    url = str(tmp_path / "run")
    monkeypatch.setenv("DIST_RESUME_LEASE_REFRESH", "0.2")
    _save(url, 1)  # this test's process holds the lease
    out = tmp_path / "out"
    run("leased_elsewhere", 2, {"out": str(out), "url": url}, free_port(), script=rank_agreement_worker.__file__)
    errors = [(out / f"leased-error-{rank}.txt").read_text() for rank in (0, 1)]
    assert errors[0] == errors[1]
    assert re.fullmatch(refused(url, socket.gethostname(), os.getpid(), "0", stale_after="0.8"),
                        errors[0].removeprefix("CheckpointError: ").strip()), errors[0]
    assert not os.path.exists(os.path.join(url, "step_00000005"))


@pytest.mark.slow
def test_every_rank_saves_once_rank_0_has_watched_a_dead_job_s_lease_go_stale(tmp_path: Path) -> None:
    """The old rank 0 died on another machine (its heartbeat every 0.5 s, so stale after 2 s
    unchanged): rank 1 waits in the save's collective while rank 0 watches, and step 5 commits."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    write_record(Path(url, ".writer_lease_0"), time.time(), refresh=0.5)
    out = tmp_path / "out"
    run("leased_elsewhere", 2, {"out": str(out), "url": url}, free_port(), script=rank_agreement_worker.__file__)
    assert [(out / f"leased-error-{rank}.txt").read_text() for rank in (0, 1)] == ["none", "none"]
    assert [info.step for info in list_checkpoints(url)] == [5]
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]


@pytest.mark.parametrize("heartbeat_age", [3600, 121, 0, -86400])
def test_a_lease_seen_unchanged_for_its_stale_period_is_taken_over(tmp_path: Path, heartbeat_age: float) -> None:
    """4 refresh periods (0.2 s) without a change: stale, whatever the record's clock says."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    write_record(Path(url, ".writer_lease_3"), time.time() - heartbeat_age)
    _save(url, 1)
    assert leases(url) == [".writer_lease_3", ".writer_lease_4"]


def test_a_live_lease_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    os.makedirs(url)
    with beating(Path(url, ".writer_lease_3")), \
            pytest.raises(CheckpointError, match="^" + refused(url, "another-host", 4242, "3") + "$"):
        _save(url, 1)
    assert not os.path.exists(os.path.join(url, "step_00000001"))
    assert leases(url) == [".writer_lease_3"]


@pytest.mark.parametrize("run_id", ["run-7", "none"])
def test_the_same_torchrun_job_takes_its_lease_back_after_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    run_id: str) -> None:
    """torchrun restarted the job's workers, rank 0 now on another node, while the old rank 0
    still beats: the lease of the same run id is its own. torchrun's default id "none" names
    no job."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", run_id)
    with beating(Path(url, ".writer_lease_0"), job=run_id):
        if run_id == "none":
            with pytest.raises(CheckpointError, match="^" + refused(url, "another-host", 4242, "0") + "$"):
                _save(url, 1)
            return
        _save(url, 1)
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]


def test_a_live_lease_of_a_later_version_is_still_refused(tmp_path: Path) -> None:
    """A field this version does not know does not make a live lease look damaged."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    with beating(Path(url, ".writer_lease_0"), added_later=[1, 2]), \
            pytest.raises(CheckpointError, match="^" + refused(url, "another-host", 4242, "0") + "$"):
        _save(url, 1)


@pytest.mark.parametrize("content", [b"not a lease", b"", b"{}", b" " * 5000, b"x" * 70000])
def test_a_lease_record_that_names_no_job_is_taken_over_saying_so(tmp_path: Path, content: bytes) -> None:
    """A damaged lease cannot show that a job holds it: it is taken over at once, and the
    save says which file it took over, and why."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    Path(url, ".writer_lease_0").write_bytes(content)
    with pytest.warns(UserWarning, match="^" + re.escape(
            f"dist_resume: {url}'s writer lease .writer_lease_0 holds no lease record (damaged, emptied, removed, or "
            "written by something other than dist-resume), so it showed no job writing there; this job took the lease "
            "over as .writer_lease_1 (a job still writing there finds .writer_lease_1 at its next heartbeat or "
            "save, and writes no more)") + "$"):
        _save(url, 1)
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]


def test_a_released_lease_is_taken_at_once(tmp_path: Path) -> None:
    """The job that held it ended cleanly; its record says so, however recent its heartbeat."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    write_record(Path(url, ".writer_lease_0"), time.time(), refresh=3600.0, released=True)
    _save(url, 1)
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]


def test_a_forced_takeover_of_a_live_lease_names_the_job_it_took_it_from(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator forced it; the job's log says whose lease was taken, and what that job will do."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    monkeypatch.setenv("DIST_RESUME_TAKE_OVER", "1")
    taken = (re.escape(f"dist_resume: {url}: DIST_RESUME_TAKE_OVER=1 took over the writer lease of another job (host "
                       "another-host, pid 4242, started ") + TIME
             + re.escape(", lease .writer_lease_0) as .writer_lease_1, without waiting to see whether that job still "
                         "runs (a job still writing there finds .writer_lease_1 at its next heartbeat or save, and "
                         "writes no more)"))
    with beating(Path(url, ".writer_lease_0")), pytest.warns(UserWarning, match="^" + taken + "$"):
        _save(url, 1)
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]
    assert [info.step for info in list_checkpoints(url)] == [1]


@pytest.mark.slow
@pytest.mark.parametrize(("refresh", "ends"), [("0.2", False), ("0.2", True), ("3600", False)],
                         ids=["at_its_heartbeat", "after_the_new_job_ended", "before_any_heartbeat"])
def test_take_over_a_live_lease_and_the_old_writer_never_commits_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       refresh: str, ends: bool) -> None:
    """DIST_RESUME_TAKE_OVER=1 takes the lease of a live job A; A's saves are refused from then
    on, naming the job that took over: found by its heartbeat or, before any, by its next
    save; and also when that job has ended and released its lease before A saves again
    (issue 32 point 3: A once found no lease, wrote its own again and kept committing)."""
    url = str(tmp_path / "run")
    first = lease_job.start(url, tmp_path / "handshake", "save_until_refused", seconds=30,
                            DIST_RESUME_LEASE_REFRESH=refresh)
    try:
        monkeypatch.setenv("DIST_RESUME_TAKE_OVER", "1")
        with pytest.warns(UserWarning, match=re.escape(f"DIST_RESUME_TAKE_OVER=1 took over the writer lease of another "
                                                       f"job (host {socket.gethostname()}, pid {first.pid}, started ")):
            _save(url, 100)
        if ends:
            release_all()
        (tmp_path / "handshake" / "go").write_text("")
        assert first.wait(timeout=150) == 0, first.communicate()[0].decode()
    finally:
        first.kill()
    outcome = (tmp_path / "handshake" / "outcome").read_text()
    expected = (re.escape(f"cannot save to {url}: another job took over this run's writer lease (host "
                          f"{socket.gethostname()}, pid {os.getpid()}, started ")
                + TIME + re.escape(", lease .writer_lease_1); this job no longer writes there"))
    assert re.fullmatch(expected, outcome), outcome
    assert [info.step for info in list_checkpoints(url)] == [1, 100]
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]


def test_the_refresh_period_must_be_a_positive_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DIST_RESUME_LEASE_REFRESH", "soon")
    with pytest.raises(CheckpointError, match="^DIST_RESUME_LEASE_REFRESH='soon' is not a number of seconds above 0 "
                                              "and at most 86400$"):
        _save(str(tmp_path / "run"), 1)


def test_on_s3_two_jobs_creating_the_lease_at_once_give_one_writer(s3_bucket: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Both jobs saw no lease; the other job's conditional PUT (If-None-Match) came first, so
    this one's fails, and it is refused naming that job: its lease appeared, a change this job saw."""
    url = f"{s3_bucket}/run"
    store = open_store(resolve(url))
    theirs = record(time.time(), refresh=30.0, pid=77)
    looks = []

    def stale_view(files):  # the listing this job read before the other job created its lease
        looks.append(True)
        return None if len(looks) == 1 else real(files)

    real = LeaseFiles.newest
    assert store.create_exclusive(store.loc.join(".writer_lease_0"), theirs)
    monkeypatch.setattr(LeaseFiles, "newest", stale_view)
    with pytest.raises(CheckpointError, match="^" + refused(url, "another-host", 77, "0", stale_after="120") + "$"):
        _save(url, 1)
    assert store.loc.fs.cat_file(store.loc.join(".writer_lease_0")) == theirs
    monkeypatch.setattr(LeaseFiles, "newest", real)
    store.overwrite(store.loc.join(".writer_lease_0"), record(time.time(), refresh=0.05, pid=77))
    _save(url, 1)  # seen unchanged for 0.2 s: stale, taken over
    names = sorted(name.rsplit("/", 1)[1] for name in store.loc.fs.ls(store.loc.root))
    assert names == [".commits", ".writer_lease_0", ".writer_lease_1", "step_00000001"]


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
