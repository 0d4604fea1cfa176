"""A writer lease that lies (issue 33 "two writers at once, and a lease that lies"): one
writer per run for any name found in the run's folder, a name that is not a lease (or a
lease that is not a regular file) refused by name, staleness judged by what this job sees
change and never by another machine's clock (G10), and a job whose lease file something
else removed or overwrote writing no more. Takeovers: tests/test_writer_lease.py."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from dist_resume import list_checkpoints, save_checkpoint
from dist_resume.checkpoint import lease
from dist_resume.errors import CheckpointError
from dist_resume.storage import open_store, resolve
from tests.lease_records import TIME, beating, leases, record, refused, write_record

NOT_A_LEASE = ("which is not a writer lease (those are regular files named .writer_lease_<generation>, a decimal "
               "number without leading zeros); this job cannot tell whether another job writes there: remove it "
               "once no job writes to this run")


def _save(url: str, step: int) -> None:
    save_checkpoint({"w": torch.full((2,), float(step))}, url, step)


@pytest.fixture
def fast_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leases this process takes beat every 0.05 s: a watching job sees them change at once."""
    monkeypatch.setenv("DIST_RESUME_LEASE_REFRESH", "0.05")


def test_a_lease_of_any_width_holds_the_run(tmp_path: Path, fast_heartbeat: None) -> None:
    """A takes over generation 999999999999999999 by creating 10**18; B, starting beside live
    A, sees A's lease and is refused."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    Path(url, ".writer_lease_999999999999999999").write_text("not a record")  # names no job: taken over
    store = open_store(resolve(url))
    with pytest.warns(UserWarning, match="holds no lease record"):
        held = lease.take(store)
    watching = re.escape(f"dist_resume: {url} has the writer lease of another job (host {socket.gethostname()}, "
                         f"pid {os.getpid()}, started ") + TIME + re.escape("), its process runs on this machine; ")
    try:
        with pytest.warns(UserWarning, match="^" + watching), pytest.raises(CheckpointError, match="^" + refused(url, socket.gethostname(), os.getpid(),
                                                                "1000000000000000000", stale_after="0.2") + "$"):
            lease.take(store)
    finally:
        held.release()
    assert leases(url) == [".writer_lease_1000000000000000000", ".writer_lease_999999999999999999"]


@pytest.mark.parametrize("name", [".writer_lease_01", ".writer_lease_x", ".writer_lease_", ".writer_lease_-1",
                                  ".writer_lease_1.bak", ".writer_lease_\u00b2", ".writer_lease_\uff11",
                                  ".writer_lease_x." + "a" * 32 + ".tmp", ".writer_lease_ 1"])
def test_a_name_that_is_not_a_lease_generation_is_refused(tmp_path: Path, name: str) -> None:
    url = str(tmp_path / "run")
    os.makedirs(url)
    Path(url, name).write_text("")
    with pytest.raises(CheckpointError, match="^" + re.escape(f"cannot save to {url}: its folder holds {name!r}, "
                                                              f"{NOT_A_LEASE}") + "$"):
        _save(url, 1)
    assert list_checkpoints(url) == [] and sorted(os.listdir(url)) == [name]


def test_a_private_write_left_by_a_crash_is_not_a_lease(tmp_path: Path) -> None:
    """A local writer's private file (kill -9 during a heartbeat) is neither a lease nor refused."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    Path(url, ".writer_lease_4." + "0123456789abcdef" * 2 + ".tmp").write_text("half a rec")
    _save(url, 1)
    assert [info.step for info in list_checkpoints(url)] == [1]


@pytest.mark.parametrize("kind", ["symbolic link", "directory"])
def test_a_lease_that_is_a_link_or_a_directory_is_refused_by_name(tmp_path: Path, kind: str) -> None:
    url = str(tmp_path / "run")
    os.makedirs(url)
    outside = tmp_path / "outside"
    write_record(outside, time.time())
    written = outside.read_bytes()
    if kind == "directory":
        Path(url, ".writer_lease_0").mkdir()
    else:
        Path(url, ".writer_lease_0").symlink_to(outside)
    with pytest.raises(CheckpointError, match="^" + re.escape(
            f"cannot save to {url}: its writer lease .writer_lease_0 is a {kind}, not a regular file (dist-resume "
            "writes its lease as a regular file and never through a link); this job cannot tell whether another "
            "job writes there: remove it once no job writes to this run") + "$"):
        _save(url, 1)
    assert outside.read_bytes() == written and list_checkpoints(url) == []
    assert leases(url) == [".writer_lease_0"]


def test_a_lease_that_is_a_directory_on_s3_is_refused_by_name(s3_bucket: str) -> None:
    url = f"{s3_bucket}/run"
    store = open_store(resolve(url))
    store.loc.fs.pipe_file(store.loc.join(".writer_lease_3/inside"), b"x")
    with pytest.raises(CheckpointError, match="its writer lease .writer_lease_3 is a directory, not a regular file"):
        _save(url, 1)


def _waits(url: str, host: str, whereabouts: str) -> str:
    """The line a save prints while it watches a lease of 0.05 s heartbeats, as a regex."""
    return "^" + re.escape(f"dist_resume: {url} has the writer lease of another job (host {host}, pid 4242, started "
                           ) + TIME + re.escape(
        f"), {whereabouts}; this job waits, watching it for up to 0.2 s by its own clock: if its heartbeat changes, "
        "this save is refused, else its lease is stale and this job takes it over") + "$"


@pytest.mark.parametrize(("host", "whereabouts"), [
    ("another-host", "on another machine, so this job cannot check its process"),
    (socket.gethostname(), "its process cannot be checked from this job (another container, boot or pid namespace)"),
])
def test_a_restart_beside_a_dead_holder_it_cannot_check_waits_for_its_lease_to_go_stale(
        tmp_path: Path, host: str, whereabouts: str) -> None:
    """The old rank 0 was killed where this job cannot check its process: the restart's first
    save says so and waits, sees the lease unchanged for 4 of its refresh periods, takes it
    over and commits; no error."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    write_record(Path(url, ".writer_lease_0"), time.time(), host=host)  # its last heartbeat: just now
    with pytest.warns(UserWarning, match=_waits(url, host, whereabouts)):
        _save(url, 1)
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]
    assert [info.step for info in list_checkpoints(url)] == [1]


def test_a_dead_holder_whose_clock_runs_a_day_ahead_goes_stale(tmp_path: Path) -> None:
    """Its last heartbeat reads a day from now; nothing changes while this job watches it for
    4 of the holder's refresh periods (0.2 s), so the lease is stale and taken over."""
    url = str(tmp_path / "run")
    os.makedirs(url)
    write_record(Path(url, ".writer_lease_0"), time.time() + 86400)
    with pytest.warns(UserWarning, match=_waits(url, "another-host",
                                                "on another machine, so this job cannot check its process")):
        _save(url, 1)
    assert leases(url) == [".writer_lease_0", ".writer_lease_1"]
    assert [info.step for info in list_checkpoints(url)] == [1]


def test_a_live_holder_whose_clock_runs_a_day_ahead_is_refused_saying_so(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    os.makedirs(url)
    note = re.escape("; its recorded heartbeat time is ") + r"86[34]\d\d" + re.escape(
        " s ahead of this machine's clock: the clocks disagree, and this job judges a lease only by what it sees "
        "change")
    with beating(Path(url, ".writer_lease_0"), clock_offset=86400), \
            pytest.raises(CheckpointError, match="^" + refused(url, "another-host", 4242, "0", note) + "$"):
        _save(url, 1)
    assert list_checkpoints(url) == [] and leases(url) == [".writer_lease_0"]


@pytest.mark.parametrize("where", ["local", "moto"])
@pytest.mark.parametrize("change", ["removed", "overwritten"])
def test_a_job_whose_lease_was_removed_or_overwritten_writes_no_more(tmp_path: Path, request: pytest.FixtureRequest,
                                                                      change: str, where: str) -> None:
    """Nothing in dist-resume removes a lease or writes another job's: something else did,
    and this job cannot tell who writes now. The check comes before the commit: the step this
    save wrote is not committed."""
    url = str(tmp_path / "run") if where == "local" else f"{request.getfixturevalue('s3_bucket')}/run"
    _save(url, 1)
    store = open_store(resolve(url))
    path = store.loc.join(".writer_lease_0")
    if change == "removed":
        store.remove_file(path)
    else:
        store.overwrite(path, record(time.time()))
    with pytest.raises(CheckpointError, match="^" + re.escape(
            f"cannot save to {url}: this job's writer lease .writer_lease_0 was removed or overwritten by something "
            "other than this job (by hand, or by another job on a store whose create-if-absent failed): another job "
            "may write there; this job no longer writes there") + "$"):
        _save(url, 2)
    assert [info.step for info in list_checkpoints(url)] == [1]


def test_a_lease_rewritten_while_it_is_read_on_s3_is_never_taken_for_no_lease(s3_bucket: str) -> None:
    """A live holder's heartbeat replaces its record, of another length each time, while this
    job reads it: every read sees one whole version (a size from one version and bytes from
    another once made it "a record that names no job", taken over at once)."""
    url = f"{s3_bucket}/run"
    store = open_store(resolve(url))
    path = store.loc.join(".writer_lease_0")
    stop = threading.Event()

    def beat() -> None:
        beats = 0
        while not stop.is_set():
            beats += 1
            store.overwrite(path, record(time.time(), beat=beats, padding="x" * (beats % 7)))

    store.overwrite(path, record(time.time()))
    thread = threading.Thread(target=beat)
    thread.start()
    try:
        for _ in range(20):
            with pytest.raises(CheckpointError, match="^" + refused(url, "another-host", 4242, "0") + "$"):
                lease.take(store)
    finally:
        stop.set()
        thread.join()
    assert sorted(name.rsplit("/", 1)[1] for name in store.loc.fs.ls(store.loc.root)) == [".writer_lease_0"]
