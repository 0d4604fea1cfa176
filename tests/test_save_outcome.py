"""A save's outcome is one fact (G7): ``save_checkpoint`` returns only if its step is
committed (its marker exists and names this save's attempt), and raises only if it is not,
whatever else the run's folder holds and wherever storage fails (issue 33). A save that
cannot tell raises SaveOutcomeUnknownError, which says so.

Issue 32: a kill between rank 0's commit of step 120 and the save's last broadcast made the
survivor print "cannot save step 120 ... a peer rank is gone", though step 120 was committed.
Real 2-rank gloo jobs below; rank 0 stops at a kill point inside its commit, and the test
kills a rank there (tests/save_outcome_worker.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.checkpoint.load import list_checkpoints, load_checkpoint
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name
from dist_resume.errors import CheckpointError, CheckpointExistsError, SaveOutcomeUnknownError, StorageError
from dist_resume.storage import CheckpointStore

from tests import save_outcome_worker
from tests.checkpoint_worker import launch
from tests.layout import committed_dir, load_weights as _load, weights as _state
from tests.s3_server import free_port


def _foreign_file(index: Path, name: str) -> None:
    (index / name).write_text("written by another tool")


def _foreign_directory(index: Path, name: str) -> None:
    (index / name).mkdir()
    (index / name / "part-0000").write_text("x")


FOREIGN = {
    ".DS_Store": lambda index: _foreign_file(index, ".DS_Store"),
    "_SUCCESS": lambda index: _foreign_file(index, "_SUCCESS"),
    "a leftover of ours": lambda index: _foreign_file(index, "step_00000031.tmp"),
    "a misnamed entry": lambda index: _foreign_file(index, "step_31.w1.b5.t1"),
    "a directory": lambda index: _foreign_directory(index, "step_00000009"),
}


@pytest.mark.parametrize("foreign", sorted(FOREIGN))
def test_a_foreign_object_in_the_index_is_ignored(tmp_path: Path, foreign: str) -> None:
    run = tmp_path / "run"
    save_checkpoint(_state(1.0), str(run), 1)
    FOREIGN[foreign](run / ".commits")
    assert save_checkpoint(_state(2.0), str(run), 2, keep=5) is None
    assert _load(str(run)) == (2, 2.0)
    assert [info.step for info in list_checkpoints(str(run))] == [1, 2]
    with pytest.raises(CheckpointExistsError):  # committed once, and said so
        save_checkpoint(_state(3.0), str(run), 2)


def _index_is_a_file(run: Path) -> None:
    shutil.rmtree(run / ".commits")
    (run / ".commits").write_text("not a directory")


def _index_is_a_link(run: Path) -> None:
    elsewhere = run.parent / "elsewhere"
    (run / ".commits").rename(elsewhere)
    (run / ".commits").symlink_to(elsewhere)


@pytest.mark.parametrize("index, what", [(_index_is_a_file, "not a directory"), (_index_is_a_link, "a symbolic link")])
def test_an_index_that_is_not_a_directory_leaves_the_save_committed(tmp_path: Path, index, what: str) -> None:
    """The save succeeds, says what is true of the index, and never writes through a link."""
    run = tmp_path / "run"
    save_checkpoint(_state(1.0), str(run), 1)
    index(run)
    linked = sorted(os.listdir(tmp_path / "elsewhere")) if (tmp_path / "elsewhere").exists() else None
    with pytest.warns(UserWarning) as caught:
        assert save_checkpoint(_state(2.0), str(run), 2) is None
    messages = [str(warning.message) for warning in caught if "torch.distributed is disabled" not in str(warning.message)]
    assert messages == [f"step 2 at {run} is committed, but it was not indexed: {run / '.commits'} is {what}; "
                        "the index of committed steps must be a directory written by save_checkpoint (listings "
                        "read each step's commit marker instead)"]
    assert (run / step_dir_name(2) / MARKER).is_file()
    assert _load(str(run)) == (2, 2.0)
    assert [info.step for info in list_checkpoints(str(run))] == [1, 2]
    if linked is not None:
        assert sorted(os.listdir(tmp_path / "elsewhere")) == linked


class _Failing:
    """Storage that fails once: the ``at``-th call (from 0) of any store operation raises a
    StorageError, before the operation (``after=False``) or after it took effect (its
    response lost)."""

    OPERATIONS = ("kind", "entries", "exists", "create_exclusive", "overwrite", "remove_tree", "remove_file",
                  "tree_size", "ensure_directory")

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: int, after: bool) -> None:
        self.calls = 0
        self.at, self.after = at, after
        self.failed: str | None = None
        for store_class in CheckpointStore.__subclasses__():
            for name in self.OPERATIONS:
                monkeypatch.setattr(store_class, name, self._failing(name, getattr(store_class, name)))

    def _failing(self, name: str, original):
        def operation(store, *args, **kwargs):
            index, self.calls = self.calls, self.calls + 1
            if index != self.at:
                return original(store, *args, **kwargs)
            self.failed = name
            if self.after:
                original(store, *args, **kwargs)
            raise StorageError(f"injected failure of {name}")

        return operation


def _attempt_committed(run: Path, step: int) -> bool:
    return (run / step_dir_name(step) / MARKER).is_file()


def _calls_of_a_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    run = tmp_path / "count"
    save_checkpoint(_state(1.0), str(run), 1)
    with monkeypatch.context() as patched:
        counter = _Failing(patched, -1, False)
        save_checkpoint(_state(2.0), str(run), 2, keep=1)
    return counter.calls


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_one_outcome_whatever_storage_operation_fails(tmp_path_factory, data) -> None:
    """Any one storage operation of a save with keep= failing, before or after it took
    effect: the save either returns and its step is committed, or raises and it is not."""
    tmp_path = tmp_path_factory.mktemp("outcome")
    with pytest.MonkeyPatch.context() as monkeypatch:
        total = _calls_of_a_save(tmp_path, monkeypatch)
        at = data.draw(st.integers(0, total - 1), label="failing call")
        after = data.draw(st.booleans(), label="after it took effect")
        run = tmp_path / "run"
        save_checkpoint(_state(1.0), str(run), 1)
        failing = _Failing(monkeypatch, at, after)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                save_checkpoint(_state(2.0), str(run), 2, keep=1)
                raised = None
            except CheckpointError as exc:  # StorageError is one
                raised = exc
    assert failing.failed is not None
    committed = _attempt_committed(run, 2)
    assert (raised is None) == committed, (failing.failed, after, raised)
    if committed:  # the step committed is this save's, whole
        assert json.loads((run / step_dir_name(2) / MARKER).read_text())["step"] == 2
        assert committed_dir(run, 2).is_dir()
        assert _load(str(run)) == (2, 2.0)
    else:
        assert _load(str(run)) == (1, 1.0)


def _lose_commit_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every exclusive creation takes effect, and then its answer is lost."""
    for store_class in CheckpointStore.__subclasses__():
        original = store_class.create_exclusive

        def lost(store, path, data, original=original):
            original(store, path, data)
            raise StorageError(f"cannot commit {path}: connection reset")

        monkeypatch.setattr(store_class, "create_exclusive", lost)


def test_a_lost_commit_response_is_a_committed_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker is created but its creation's response is lost (a local directory fsync
    failing after the link, an S3 PUT whose answer never came): the save succeeded."""
    run = tmp_path / "run"
    save_checkpoint(_state(1.0), str(run), 1)
    _lose_commit_answers(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert save_checkpoint(_state(2.0), str(run), 2) is None
    monkeypatch.undo()
    assert _load(str(run)) == (2, 2.0)


def test_an_unknown_outcome_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Storage gone right as the marker is created: the save cannot know whether its step is
    committed, and its error says that (not that it failed)."""
    run = tmp_path / "run"
    save_checkpoint(_state(1.0), str(run), 1)
    _lose_commit_answers(monkeypatch)
    import dist_resume.checkpoint.marker as marker

    def unreadable(loc, path, *args, **kwargs):
        raise StorageError(f"cannot read {path}: connection reset")

    monkeypatch.setattr(marker, "read_whole", unreadable)
    with pytest.raises(SaveOutcomeUnknownError) as raised:
        save_checkpoint(_state(2.0), str(run), 2)
    assert str(raised.value) == (
        f"whether step 2 at {run} is committed is not known: creating its commit marker failed (cannot commit "
        f"{run / step_dir_name(2) / MARKER}: connection reset) and reading its commit marker failed too (cannot read "
        f"{run / step_dir_name(2) / MARKER}: connection reset); list_checkpoints tells once storage answers")



PEER_GONE = "a peer rank is gone or did not take part within the process group's timeout (60 s) ("


def lose_a_peer(tmp_path: Path, point: str, victim: int, async_save: bool) -> tuple[Path, dict]:
    """Run the save, kill ``victim`` once rank 0 waits at ``point``, release rank 0 if it
    lives; return the URL and how the other rank's save ended (and what it warned)."""
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
    return url, json.loads((out / f"commit-outcome-{1 - victim}.json").read_text())


def assert_step_5_loads(url: Path) -> None:
    assert [info.step for info in list_checkpoints(str(url))] == [5]
    state = {"w": torch.zeros(2), "rank0": torch.zeros(3), "rank1": torch.zeros(3)}
    assert load_checkpoint(state, str(url)) == 5
    assert torch.equal(state["w"], torch.zeros(2)) and torch.equal(state["rank1"], torch.ones(3))


def assert_returned_saying_committed(url: Path, outcome: dict) -> None:
    """The save returned (its step is committed: G7) and warned, once, that it is committed
    though a peer is gone (G10: the training's next collective fails, and says why)."""
    assert outcome["ended"] == "returned", outcome
    assert len(outcome["warnings"]) == 1, outcome
    assert outcome["warnings"][0].startswith(f"step 5 at {url} is committed, but the save did not end on every "
                                             f"rank: {PEER_GONE}"), outcome


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_rank_0_gone_after_its_commit_leaves_the_other_rank_returning_committed(
        tmp_path: Path, async_save: bool) -> None:
    url, outcome = lose_a_peer(tmp_path, "after_marker", victim=0, async_save=async_save)
    assert_returned_saying_committed(url, outcome)
    assert_step_5_loads(url)


@pytest.mark.slow
def test_rank_0_gone_before_its_commit_leaves_the_other_rank_unable_to_tell(tmp_path: Path) -> None:
    """Rank 1 cannot know whether rank 0 is dead or only late: rank 0 commits alone, and may
    still commit. It raises, and its error says that the outcome is not known, not that the
    save failed."""
    url, outcome = lose_a_peer(tmp_path, "before_marker", victim=0, async_save=False)
    assert outcome["ended"].startswith(
        f"SaveOutcomeUnknownError: whether step 5 at {url} is committed is not known to this rank: it was not "
        "committed when this rank looked, and rank 0, which commits alone, may yet commit it if it is still "
        f"running (list_checkpoints tells): {PEER_GONE}"), outcome
    assert outcome["warnings"] == [], outcome
    assert list_checkpoints(str(url)) == []


@pytest.mark.slow
def test_rank_0_that_commits_after_its_peer_is_gone_returns_committed(tmp_path: Path) -> None:
    url, outcome = lose_a_peer(tmp_path, "before_marker", victim=1, async_save=False)
    assert_returned_saying_committed(url, outcome)
    assert_step_5_loads(url)


class RefusingFileSystem(MemoryFileSystem):
    """In-memory files; writes into the run's index, or deleting step 1's marker, are refused
    as an object store without those permissions refuses them."""

    protocol = "refusing"
    store: dict = {}
    pseudo_dirs = [""]
    refuse = ""

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("refusing://"))

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
    RefusingFileSystem.pseudo_dirs[:] = [""]
    yield RefusingFileSystem
    RefusingFileSystem.refuse = ""


def test_a_step_whose_index_entry_cannot_be_written_returns_committed(refusing: type[RefusingFileSystem]) -> None:
    refusing.refuse = "index"
    with pytest.warns(UserWarning, match="^" + re.escape(
            "step 1 at refusing://run is committed, but it was not indexed: cannot commit "
            "refusing://run/.commits/step_00000001.w1.") + r".*\(PermissionError: Access Denied\) "
            + re.escape("(listings read each step's commit marker instead)") + "$"):
        assert save_checkpoint({"w": torch.ones(2)}, "refusing://run", 1) is None
    state = {"w": torch.zeros(2)}
    assert load_checkpoint(state, "refusing://run") == 1 and torch.equal(state["w"], torch.ones(2))


def test_a_step_whose_older_steps_cannot_be_deleted_returns_committed(refusing: type[RefusingFileSystem]) -> None:
    save_checkpoint({"w": torch.ones(2)}, "refusing://run", 1, keep=1)
    refusing.refuse = "delete"
    with pytest.warns(UserWarning, match="^" + re.escape(
            "step 2 at refusing://run is committed, but older steps were not pruned (keep=1): cannot delete "
            "refusing://run/step_00000001/.committed: access denied, check the credentials "
            "(PermissionError: Access Denied); the next save with keep= prunes them") + "$"):
        assert save_checkpoint({"w": torch.full((2,), 2.0)}, "refusing://run", 2, keep=1) is None
    assert [info.step for info in list_checkpoints("refusing://run")] == [1, 2]
    state = {"w": torch.zeros(2)}
    assert load_checkpoint(state, "refusing://run") == 2 and torch.equal(state["w"], torch.full((2,), 2.0))
    refusing.refuse = ""  # the next save with keep= prunes step 1
    save_checkpoint({"w": torch.full((2,), 3.0)}, "refusing://run", 3, keep=1)
    assert [info.step for info in list_checkpoints("refusing://run")] == [3]
