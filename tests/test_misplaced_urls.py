"""A URL one level off is an error that says which URL to give, not a first start
(issue 11 point 4); step directories are read literally, never mixed (points 2 and 4)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_resume import ResumableDataLoader, list_checkpoints, load_checkpoint, read_loader_states, save_checkpoint
from dist_resume.checkpoint.bounded_reader import BoundedReader
from dist_resume.errors import CheckpointError, CheckpointNotFoundError, StorageError
from tests.layout import committed_dir


def _save(url: Path, step: int = 1, value: float = 1.0) -> None:
    save_checkpoint({"w": torch.full((2,), value)}, str(url), step)


def _refused(url: str, message: str) -> None:
    """load_checkpoint, read_loader_states and list_checkpoints all refuse ``url`` with ``message``."""
    for call in (lambda: load_checkpoint({"w": torch.zeros(2)}, url), lambda: read_loader_states(url),
                 lambda: list_checkpoints(url)):
        with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
            call()


def test_a_step_directory_names_its_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _save(run)
    step = run / "step_00000001"
    _refused(str(step), f"{step} is a step directory; give the run's URL {run}")
    attempt = committed_dir(run, 1)
    _refused(str(attempt), f"{attempt} is one save's directory inside a step; give the run's URL {run}")


def test_a_file_of_a_checkpoint_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _save(run)
    for path in (committed_dir(run, 1) / ".metadata", run / "step_00000001" / ".committed"):
        _refused(str(path), f"{path} is a file of a checkpoint; give the URL of the run that holds its "
                            "step directories, not a file in one")
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    _refused(str(other), f"{other} is a file, not a checkpoint location (a directory or prefix)")


def test_a_plain_dcp_save_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(plain))
    _refused(str(plain), f"{plain} holds a checkpoint written by torch.distributed.checkpoint directly, "
                         "without save_checkpoint's commit; load it with torch.distributed.checkpoint.load, "
                         "or give the URL save_checkpoint wrote to")


def test_a_step_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere, run = tmp_path / "elsewhere", tmp_path / "run"
    _save(elsewhere)
    run.mkdir()
    (run / "step_00000001").symlink_to(elsewhere / "step_00000001")
    _refused(str(run), f"{run}/step_00000001 is a symbolic link; step directories must be directories "
                       "written by save_checkpoint")


def test_a_run_behind_a_link_is_an_ordinary_run(tmp_path: Path) -> None:
    _save(tmp_path / "real", value=4.0)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    state = {"w": torch.zeros(2)}
    assert load_checkpoint(state, str(tmp_path / "link")) == 1 and torch.equal(state["w"], torch.full((2,), 4.0))


def test_non_canonical_step_names_are_refused_not_mixed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _save(run, 1, 1.0)
    (run / "step_00000001").rename(run / "step_1")  # e.g. copied in by hand
    _save(run, 1, 2.0)
    _refused(str(run), f"{run} holds step_1, which is not how dist-resume names step 1 (step_00000001); "
                       "rename or remove it")


@pytest.mark.parametrize("url", ["file://", "file:///", "s3://", "memory://"])
def test_a_url_without_a_path_is_refused(url: str) -> None:
    message = f"cannot open storage for {url}: the URL names no path"
    for call in (lambda: load_checkpoint({"w": torch.zeros(2)}, url), lambda: save_checkpoint({}, url, 1)):
        with pytest.raises(StorageError, match=f"^{re.escape(message)}$"):
            call()


def test_nothing_there_is_a_first_start(tmp_path: Path) -> None:
    """Absent, empty, unrelated files, or steps that never committed: None, as before."""
    assert load_checkpoint({}, str(tmp_path / "absent")) is None
    assert load_checkpoint({}, str(tmp_path)) is None
    (tmp_path / "train.log").write_text("epoch 0")
    (tmp_path / "step_00000003" / "attempt_0123456789abcdef0123456789abcdef").mkdir(parents=True)
    assert load_checkpoint({}, str(tmp_path)) is None
    assert list_checkpoints(str(tmp_path)) == []


@pytest.mark.parametrize("name, sibling", [("run*", "run1"), ("run?", "run1"), ("run[1]", "run1"),
                                           ("r[!x]n", "run")])
def test_urls_are_names_not_patterns_locally(tmp_path: Path, name: str, sibling: str) -> None:
    """keep=1 under `run*` deleted the sibling run1's steps; `run[1]` never saw its own."""
    ours, theirs = tmp_path / name, tmp_path / sibling
    for step in (1, 2):
        _save(theirs, step, 10.0 + step)
    for step in (1, 2, 3):
        save_checkpoint({"w": torch.full((2,), float(step))}, str(ours), step, keep=1)
    assert [info.step for info in list_checkpoints(str(ours))] == [3]
    assert [info.step for info in list_checkpoints(str(theirs))] == [1, 2]
    state = {"w": torch.zeros(2)}
    assert load_checkpoint(state, str(ours)) == 3 and torch.equal(state["w"], torch.full((2,), 3.0))
    assert load_checkpoint(state, str(theirs)) == 2 and torch.equal(state["w"], torch.full((2,), 12.0))


@pytest.mark.parametrize("kind", ["link", "file"])
def test_saving_into_a_step_that_is_not_a_directory_writes_nothing(tmp_path: Path, kind: str) -> None:
    """A step directory that is a link (or a file) is refused before anything is written:
    a save through the link would write an attempt into its target, outside the run."""
    elsewhere, run = tmp_path / "elsewhere", tmp_path / "run"
    elsewhere.mkdir()
    _save(run, 1, 1.0)
    if kind == "link":
        (run / "step_00000002").symlink_to(elsewhere)
    else:
        (run / "step_00000002").write_bytes(b"not a step")
    what = "a symbolic link" if kind == "link" else "not a directory"
    message = f"{run}/step_00000002 is {what}; step directories must be directories written by save_checkpoint"
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        save_checkpoint({"w": torch.ones(2)}, str(run), 2)
    assert list(elsewhere.iterdir()) == []
    # the lease: this job writes here
    assert sorted(path.name for path in run.iterdir()) == [".commits", ".writer_lease_0", "step_00000001", "step_00000002"]


def test_a_step_pruned_while_it_loads_is_reported_as_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another job's save with keep= may delete the step this process chose to load, between
    choosing it and reading its files: that is said as such, not as damage."""
    run = tmp_path / "run"
    read_data = BoundedReader.read_data

    def pruned_first(self: BoundedReader, plan: Any, planner: Any) -> Any:
        shutil.rmtree(run / "step_00000001")  # what _prune of a concurrent save does
        return read_data(self, plan, planner)

    monkeypatch.setattr(BoundedReader, "read_data", pruned_first)
    message = (f"step 1 at {run} was removed while it was being loaded (a save with keep= pruned it?); "
               "load again to take the newest committed step")
    for call in (lambda: load_checkpoint({"loader": ResumableDataLoader(list(range(4)))}, str(run)),
                 lambda: read_loader_states(str(run))):
        save_checkpoint({"loader": ResumableDataLoader(list(range(4)))}, str(run), 1)
        with pytest.raises(CheckpointNotFoundError, match=f"^{re.escape(message)}$"):
            call()


def test_a_url_one_or_two_levels_too_high_names_the_run(tmp_path: Path) -> None:
    """The demo's run folder holds checkpoints/ beside logs/: loading the folder itself
    must not look like a first start (a silent restart from scratch)."""
    job = tmp_path / "runs" / "demo-1"
    (job / "logs").mkdir(parents=True)
    _save(job / "checkpoints")
    _refused(str(job), f"{job} holds no committed step, but {job}/checkpoints does: give the URL of the run to load")
    _save(tmp_path / "runs" / "demo-2" / "checkpoints")
    _refused(str(tmp_path / "runs"), f"{tmp_path}/runs holds no committed step, but {job}/checkpoints, "
                                     f"{tmp_path}/runs/demo-2/checkpoints do: give the URL of the run to load")


def test_a_run_three_levels_down_or_uncommitted_is_not_looked_for(tmp_path: Path) -> None:
    _save(tmp_path / "a" / "b" / "c")
    (tmp_path / "x" / "step_00000001").mkdir(parents=True)  # a save that never committed
    assert load_checkpoint({"w": torch.zeros(2)}, str(tmp_path)) is None
    assert list_checkpoints(str(tmp_path)) == []


def test_reading_loader_states_names_the_keys_that_hold_them(tmp_path: Path) -> None:
    _save(tmp_path / "plain")
    message = f"step 1 at {tmp_path}/plain holds no data loader state under 'loader'; it holds none"
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        read_loader_states(str(tmp_path / "plain"))
    save_checkpoint({"train": ResumableDataLoader(list(range(4))), "eval": ResumableDataLoader(list(range(2)))},
                    str(tmp_path / "two"), 1)
    message = (f"step 1 at {tmp_path}/two holds no data loader state under 'loader'; "
               "it holds loader states under 'eval', 'train'")
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        read_loader_states(str(tmp_path / "two"))
    assert read_loader_states(str(tmp_path / "two"), key="eval")[0] == 1
