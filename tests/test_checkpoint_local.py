"""save_checkpoint / load_checkpoint / list_checkpoints in one process (G6, G7)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch

from dist_resume.checkpoint.load import list_checkpoints, load_checkpoint
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name
from dist_resume.errors import (
    CheckpointCorruptError,
    CheckpointExistsError,
    CheckpointNotFoundError,
)
from dist_resume.loader.resumable import ResumableDataLoader
from dist_resume.state.fields import ResumeStateError
from tests.elastic_standin import StandInLoader
from tests.layout import committed_dir


def _state(value: float) -> dict:
    return {"weights": torch.full((3, 4), value), "extra": {"epoch": int(value), "name": "run"}}


def _load(url: str, step: int | None = None) -> tuple[int | None, dict]:
    state = {"weights": torch.zeros(3, 4), "extra": {"epoch": 0, "name": ""}}
    return load_checkpoint(state, url, step), state


def test_first_start_returns_none(tmp_path: Path) -> None:
    """No directory, an empty one, or only uncommitted step directories: nothing to load."""
    assert _load(str(tmp_path / "missing"))[0] is None
    assert _load(str(tmp_path))[0] is None
    (tmp_path / step_dir_name(3)).mkdir()
    (tmp_path / step_dir_name(3) / ".metadata").write_bytes(b"partial")
    assert _load(str(tmp_path))[0] is None
    assert list_checkpoints(str(tmp_path)) == []


def test_explicit_step_not_committed(tmp_path: Path) -> None:
    save_checkpoint(_state(1.0), str(tmp_path), 1)
    message = f"step 7 is not committed at {tmp_path} (committed steps: 1)"
    with pytest.raises(CheckpointNotFoundError, match=f"^{re.escape(message)}$"):
        _load(str(tmp_path), 7)
    message = f"step 7 is not committed at {tmp_path / 'empty'} (committed steps: none)"
    with pytest.raises(CheckpointNotFoundError, match=f"^{re.escape(message)}$"):
        _load(str(tmp_path / "empty"), 7)


def test_latest_committed_step_loads_with_values(tmp_path: Path) -> None:
    for step in (5, 20, 10):
        save_checkpoint(_state(float(step)), f"file://{tmp_path}", step)
    step, state = _load(str(tmp_path))
    assert step == 20 and torch.equal(state["weights"], torch.full((3, 4), 20.0))
    assert state["extra"] == {"epoch": 20, "name": "run"}
    step, state = _load(str(tmp_path), 5)
    assert step == 5 and torch.equal(state["weights"], torch.full((3, 4), 5.0))


def test_committed_step_is_never_overwritten(tmp_path: Path) -> None:
    save_checkpoint(_state(1.0), str(tmp_path), 4)
    message = (f"step 4 is already committed at {tmp_path} by this job (an earlier save of step 4 committed it, even "
               "if that save raised); a committed checkpoint is never overwritten: give each save a new step")
    with pytest.raises(CheckpointExistsError, match=f"^{re.escape(message)}$"):
        save_checkpoint(_state(2.0), str(tmp_path), 4)
    assert torch.equal(_load(str(tmp_path))[1]["weights"], torch.full((3, 4), 1.0))


def test_leftovers_of_an_uncommitted_save_are_left_alone_and_never_mixed(tmp_path: Path) -> None:
    """Files of a save of the same step that never committed (a crash, or another job
    still writing them) are not deleted by a new save and never read with its files."""
    leftover = tmp_path / step_dir_name(4) / "attempt_0123456789abcdef0123456789abcdef"
    leftover.mkdir(parents=True)
    (leftover / "__7_0.distcp").write_bytes(b"shard of another save")
    (leftover / ".metadata").write_bytes(b"metadata of another save")
    (tmp_path / step_dir_name(4) / ".metadata").write_bytes(b"a save of the old layout")
    save_checkpoint(_state(3.0), str(tmp_path), 4)
    assert sorted(p.name for p in leftover.iterdir()) == [".metadata", "__7_0.distcp"]
    assert sorted(p.name for p in committed_dir(tmp_path, 4).iterdir()) == [".metadata", "__0_0.distcp"]
    assert torch.equal(_load(str(tmp_path))[1]["weights"], torch.full((3, 4), 3.0))


def test_keep_deletes_only_older_committed_steps(tmp_path: Path) -> None:
    uncommitted = tmp_path / step_dir_name(2)
    uncommitted.mkdir()
    save_checkpoint(_state(9.0), str(tmp_path), 9)
    for step in (1, 3, 4, 5):
        save_checkpoint(_state(float(step)), str(tmp_path), step, keep=2)
    # step 9 is newer than the step just saved: kept; step 2 was never committed: untouched.
    assert [i.step for i in list_checkpoints(str(tmp_path))] == [4, 5, 9]
    assert uncommitted.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".commits", ".writer_lease_0"] + [step_dir_name(s) for s in (2, 4, 5, 9)]
    assert sorted(p.name.split(".")[0] for p in (tmp_path / ".commits").iterdir()) == [step_dir_name(s) for s in (4, 5, 9)]


def test_list_checkpoints_reports_marker_fields(tmp_path: Path) -> None:
    before = time.time()
    save_checkpoint(_state(1.0), str(tmp_path), 100)
    after = time.time()
    [info] = list_checkpoints(str(tmp_path))
    directory = tmp_path / step_dir_name(100)
    assert info.step == 100 and info.world_size == 1
    assert before <= info.committed_at <= after
    assert info.size_bytes == sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    assert info.url == str(directory)
    marker = json.loads((directory / MARKER).read_text())
    assert marker["step"] == 100 and marker["torch"] == torch.__version__


def test_truncated_shard_is_refused(tmp_path: Path) -> None:
    save_checkpoint(_state(1.0), str(tmp_path), 1)
    shard = committed_dir(tmp_path, 1) / "__0_0.distcp"
    full = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: full // 2])
    message = (f"step 1 at {tmp_path} is damaged: shard __0_0.distcp has {full // 2} bytes, "
               f"its metadata needs {full}")
    with pytest.raises(CheckpointCorruptError, match=f"^{re.escape(message)}$"):
        _load(str(tmp_path))


def test_missing_metadata_is_refused(tmp_path: Path) -> None:
    save_checkpoint(_state(1.0), str(tmp_path), 1)
    (committed_dir(tmp_path, 1) / ".metadata").unlink()
    with pytest.raises(CheckpointCorruptError, match=re.escape(f"step 1 at {tmp_path} is damaged: .metadata is missing")):
        _load(str(tmp_path))


def test_async_save_commits_in_background_one_at_a_time(tmp_path: Path) -> None:
    state = _state(1.0)
    first = save_checkpoint(state, str(tmp_path), 1, async_save=True)
    state["weights"].fill_(7.0)  # the save works on a copy taken at the call
    second = save_checkpoint(state, str(tmp_path), 2, async_save=True)
    assert first.done(), "a new save waits for the one in flight"
    assert second.result() == 2 and first.result() == 1
    assert (tmp_path / step_dir_name(2) / MARKER).exists()
    assert torch.equal(_load(str(tmp_path), 1)[1]["weights"], torch.full((3, 4), 1.0))
    assert torch.equal(_load(str(tmp_path), 2)[1]["weights"], torch.full((3, 4), 7.0))


def test_loader_error_propagates_on_dataset_length_change(tmp_path: Path) -> None:
    """G6: the loader refuses a state from another dataset; load_checkpoint does not mask it."""
    loader = ResumableDataLoader(list(range(50)), batch_size=4, shuffle=True)
    next(iter(loader))
    save_checkpoint({"loader": loader}, str(tmp_path), 1)
    other = ResumableDataLoader(list(range(60)), batch_size=4, shuffle=True)
    message = "loader state was saved for a dataset of 50 samples; this loader's dataset has 60"
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"loader": other}, str(tmp_path))


def test_loader_resumes_on_next_batch(tmp_path: Path) -> None:
    loader = ResumableDataLoader(list(range(50)), batch_size=4, shuffle=True, seed=3)
    batches = iter(loader)
    first = [next(batches) for _ in range(3)]
    save_checkpoint({"loader": loader}, str(tmp_path), 3)
    rest = list(batches)
    resumed = ResumableDataLoader(list(range(50)), batch_size=4, shuffle=True, seed=3)
    assert load_checkpoint({"loader": resumed}, str(tmp_path)) == 3
    assert [b.tolist() for b in resumed] == [b.tolist() for b in rest]
    assert sorted(i for b in first + rest for i in b.tolist()) == list(range(50))


def test_elastic_entry_gets_saved_entries_not_its_own_template(tmp_path: Path) -> None:
    """The loader's entry is built from the checkpoint's metadata: a fresh loader whose own
    state_dict has other sizes still receives the saved entries."""
    loader = StandInLoader(50, rank=0, world_size=1)
    loader.next_batch(10)
    save_checkpoint({"loader": loader}, str(tmp_path), 1)
    fresh = StandInLoader(50, rank=0, world_size=1)
    assert load_checkpoint({"loader": fresh}, str(tmp_path)) == 1
    assert fresh.remaining == list(range(10, 50))
