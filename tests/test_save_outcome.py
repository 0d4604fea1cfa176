"""A save's outcome is one fact (G7): ``save_checkpoint`` returns only if its step is
committed (its marker exists and names this save's attempt), and raises only if it is not,
whatever else the run's folder holds and wherever storage fails (issue 33)."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.checkpoint.load import list_checkpoints
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name
from dist_resume.errors import CheckpointError, CheckpointExistsError, StorageError
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
    with pytest.raises(CheckpointError) as raised:
        save_checkpoint(_state(2.0), str(run), 2)
    assert str(raised.value) == (
        f"whether step 2 at {run} is committed is not known: creating its commit marker failed (cannot commit "
        f"{run / step_dir_name(2) / MARKER}: connection reset) and reading its commit marker failed too (cannot read "
        f"{run / step_dir_name(2) / MARKER}: connection reset); list_checkpoints tells once storage answers")


@pytest.mark.slow
@pytest.mark.parametrize("before", [True, False], ids=["before the marker", "after the marker"])
def test_a_rank_whose_peer_died_at_the_commit_says_what_the_marker_says(tmp_path: Path, before: bool) -> None:
    """Rank 0 dies right before or right after creating step 2's marker (issue 32: a kill
    between the commit and the save's last broadcast made the survivor say "cannot save"
    of a committed step). The survivor's save fails, or returns and warns, as the marker says."""
    run, out = tmp_path / "run", tmp_path / "out"
    procs = launch("rank0_dies_at_commit", 2, {"url": str(run), "out": str(out), "before": before}, free_port(),
                   script=save_outcome_worker.__file__)
    codes = [proc.wait(timeout=240) for proc in procs]
    logs = "\n".join((out / f"rank0_dies_at_commit-rank{rank}.log").read_text() for rank in range(2))
    assert codes == [17, 0], logs
    result = json.loads((out / "rank1.json").read_text())
    assert _attempt_committed(run, 2) == (not before)
    if before:
        assert result["ended"].startswith(f"CheckpointError: cannot save step 2 at {run}: a peer rank is gone"), result
        assert _load(str(run)) == (1, 0.0)
        return
    assert result["ended"] == "returned", result
    assert len(result["warnings"]) == 1 and result["warnings"][0].startswith(
        f"step 2 at {run} is committed, but this rank then saw "), result
    assert _load(str(run)) == (2, 10.0)
