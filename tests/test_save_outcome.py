"""A save that fails says whether its step is committed (G7). Issue 32: a kill between rank 0's
commit of step 120 and the save's last broadcast made the survivor print "cannot save step 120
... a peer rank is gone", though step 120 was committed. Real 2-rank gloo jobs; rank 0 stops at
a kill point inside its commit, and the test kills a rank there. Storage that fails after the
commit marker is stored (indexing the step, deleting old ones) is the same kind of failure."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from dist_resume import list_checkpoints, load_checkpoint, save_checkpoint
from dist_resume.errors import StorageError
from tests import save_outcome_worker
from tests.checkpoint_worker import launch
from tests.s3_server import free_port

PEER_GONE = "a peer rank is gone or did not take part within the process group's timeout (60 s) ("


def lose_a_peer(tmp_path: Path, point: str, victim: int, async_save: bool) -> tuple[Path, str]:
    """Run the save, kill ``victim`` once rank 0 waits at ``point``, release rank 0 if it
    lives; return the URL and what the other rank's save raised."""
    url, out, ready, release = tmp_path / "run", tmp_path / "out", tmp_path / "ready", tmp_path / "release"
    args = {"out": str(out), "url": str(url), "point": point, "ready": str(ready), "release": str(release),
            "async_save": async_save}
    procs = launch("commit", 2, args, free_port(), script=save_outcome_worker.__file__)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert all(p.poll() is None for p in procs), "a rank exited before rank 0 reached the kill point"
            assert time.monotonic() < deadline, "rank 0 did not reach the kill point"
            time.sleep(0.05)
        procs[victim].send_signal(signal.SIGKILL)
        assert procs[victim].wait(timeout=60) == -signal.SIGKILL
        release.write_text("")
        survivor = procs[1 - victim]
        assert survivor.wait(timeout=120) == 0, (out / f"commit-rank{1 - victim}.log").read_text()
    finally:
        for proc in procs:
            proc.kill()
    return url, (out / f"commit-error-{1 - victim}.txt").read_text()


def assert_step_5_loads(url: Path) -> None:
    assert [info.step for info in list_checkpoints(str(url))] == [5]
    state = {"w": torch.zeros(2), "rank0": torch.zeros(3), "rank1": torch.zeros(3)}
    assert load_checkpoint(state, str(url)) == 5
    assert torch.equal(state["w"], torch.zeros(2)) and torch.equal(state["rank1"], torch.ones(3))


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_rank_0_gone_after_its_commit_leaves_the_other_rank_saying_the_step_is_committed(
        tmp_path: Path, async_save: bool) -> None:
    url, error = lose_a_peer(tmp_path, "after_marker", victim=0, async_save=async_save)
    assert error.startswith(f"CheckpointError: step 5 at {url} is committed, but the save did not end on every "
                            f"rank: {PEER_GONE}"), error
    assert_step_5_loads(url)


@pytest.mark.slow
def test_rank_0_gone_before_its_commit_leaves_the_other_rank_saying_the_step_was_not_committed(
        tmp_path: Path) -> None:
    url, error = lose_a_peer(tmp_path, "before_marker", victim=0, async_save=False)
    assert error.startswith(f"CheckpointError: cannot save step 5 at {url}, which was not committed when this rank "
                            "looked (rank 0 commits alone and, if it is still running, may yet commit it): "
                            f"{PEER_GONE}"), error
    assert list_checkpoints(str(url)) == []


@pytest.mark.slow
def test_rank_0_that_commits_after_its_peer_is_gone_says_the_step_is_committed(tmp_path: Path) -> None:
    url, error = lose_a_peer(tmp_path, "before_marker", victim=1, async_save=False)
    assert error.startswith(f"CheckpointError: step 5 at {url} is committed, but the save did not end on every "
                            f"rank: {PEER_GONE}"), error
    assert_step_5_loads(url)


class RefusingFileSystem(MemoryFileSystem):
    """In-memory files; writes into the run's index, or deleting step 1's marker, are refused
    as an object store without those permissions refuses them."""

    protocol = "refusing"
    store: dict = {}
    pseudo_dirs = [""]
    refuse = ""

    def _open(self, path: str, mode: str = "rb", **kwargs):
        if "w" in mode and self.refuse == "index" and "/.commits/" in path:
            raise PermissionError("Access Denied")
        return super()._open(path, mode, **kwargs)

    def rm_file(self, path: str) -> None:
        if self.refuse == "delete" and path.endswith("step_00000001/.committed"):
            raise PermissionError("Access Denied")
        super().rm_file(path)


@pytest.fixture
def refusing() -> Iterator[type[RefusingFileSystem]]:
    fsspec.register_implementation("refusing", RefusingFileSystem, clobber=True)
    RefusingFileSystem.store.clear()
    yield RefusingFileSystem
    RefusingFileSystem.refuse = ""


def test_a_step_whose_index_entry_cannot_be_written_is_reported_committed(
        refusing: type[RefusingFileSystem]) -> None:
    refusing.refuse = "index"
    with pytest.raises(StorageError, match="^" + re.escape(
            "step 1 at refusing://run is committed, but indexing it failed (loads find it by its marker): "
            "cannot commit refusing://run/.commits/step_00000001.w1.") + r".*\(PermissionError: Access Denied\)$"):
        save_checkpoint({"w": torch.ones(2)}, "refusing://run", 1)
    state = {"w": torch.zeros(2)}
    assert load_checkpoint(state, "refusing://run") == 1 and torch.equal(state["w"], torch.ones(2))


def test_a_step_whose_older_steps_cannot_be_deleted_is_reported_committed(
        refusing: type[RefusingFileSystem]) -> None:
    save_checkpoint({"w": torch.ones(2)}, "refusing://run", 1, keep=1)
    refusing.refuse = "delete"
    with pytest.raises(StorageError, match="^" + re.escape(
            "step 2 at refusing://run is committed, but deleting the steps beyond keep=1 failed: cannot delete "
            "refusing://run/step_00000001/.committed: access denied, check the credentials "
            "(PermissionError: Access Denied)") + "$"):
        save_checkpoint({"w": torch.full((2,), 2.0)}, "refusing://run", 2, keep=1)
    assert [info.step for info in list_checkpoints("refusing://run")] == [1, 2]
    state = {"w": torch.zeros(2)}
    assert load_checkpoint(state, "refusing://run") == 2 and torch.equal(state["w"], torch.full((2,), 2.0))
