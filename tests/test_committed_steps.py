"""What a committed step is, decided in one place (G7): its commit marker, read and checked.
The run's index of commits only saves requests; where it disagrees with the markers, the
markers win, for loading, listing, inspecting and pruning alike (issue 33, issue 32 point 4)."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import ResumableDataLoader
from dist_resume.checkpoint.load import list_checkpoints, load_checkpoint, read_loader_states
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name
from dist_resume.cli import main
from dist_resume.errors import CheckpointCorruptError

from tests.layout import committed_dir, load_weights as _load, weights as _state


def _steps(url: str) -> list[int]:
    return [info.step for info in list_checkpoints(url)]


def _entries(run: Path, step: int) -> list[Path]:
    return sorted((run / ".commits").glob(f"{step_dir_name(step)}*"))


def test_a_step_whose_marker_was_removed_is_not_committed(tmp_path: Path) -> None:
    """Its index entry left behind: the newest truly committed step loads and lists."""
    for step in (1, 2, 3):
        save_checkpoint(_state(float(step)), str(tmp_path), step)
    (tmp_path / step_dir_name(3) / MARKER).unlink()
    assert _entries(tmp_path, 3)
    for _ in range(2):  # every time, not once
        assert _load(str(tmp_path)) == (2, 2.0)
    assert _steps(str(tmp_path)) == [1, 2]


def _uncommitted_attempt(run: Path, step: int, model: int) -> None:
    """Step ``step`` as a save that wrote its files and an index entry, but never its marker
    (an entry copied from step ``model``'s)."""
    source = committed_dir(run, model)
    target = run / step_dir_name(step) / f"attempt_{uuid.uuid4().hex}"
    shutil.copytree(source, target)
    (entry,) = _entries(run, model)
    data = json.loads(entry.read_text())
    name = entry.name.replace(step_dir_name(model), step_dir_name(step), 1)
    (run / ".commits" / name).write_text(json.dumps({**data, "step": step, "attempt": target.name}))


def test_keep_never_deletes_a_committed_step_for_an_uncommitted_one(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(_state(float(step)), str(tmp_path), step)
    _uncommitted_attempt(tmp_path, 4, 3)
    assert _load(str(tmp_path)) == (3, 3.0)
    assert _steps(str(tmp_path)) == [1, 2, 3]
    save_checkpoint(_state(5.0), str(tmp_path), 5, keep=2)
    assert _steps(str(tmp_path)) == [3, 5]
    assert not (tmp_path / step_dir_name(1)).exists() and not (tmp_path / step_dir_name(2)).exists()
    assert (tmp_path / step_dir_name(4)).is_dir()  # not a step: neither counted nor deleted
    assert _load(str(tmp_path)) == (5, 5.0)
    state = _state(-1.0)
    assert load_checkpoint(state, str(tmp_path), step=3) == 3 and float(state["weights"][0]) == 3.0


def _loader_run(run: Path) -> None:
    loader = ResumableDataLoader(list(range(32)), batch_size=4, shuffle=True, seed=3)
    batches = iter(loader)
    for step in (1, 2):
        next(batches)
        save_checkpoint({"loader": loader}, str(run), step)


def test_ls_inspect_and_load_agree_on_a_damaged_marker(tmp_path: Path, capsys) -> None:
    """Issue 32 point 4: a damaged marker is one error, the same for all of them."""
    _loader_run(tmp_path)
    (tmp_path / step_dir_name(2) / MARKER).write_text('{"step": 2, "world_size": 1, "committ')
    message = f"step 2 at {tmp_path} is damaged: its commit marker is not JSON"
    for call in (lambda: list_checkpoints(str(tmp_path)), lambda: read_loader_states(str(tmp_path)),
                 lambda: load_checkpoint({"loader": ResumableDataLoader(list(range(32)), batch_size=4)}, str(tmp_path))):
        with pytest.raises(CheckpointCorruptError, match=f"^{re.escape(message)}"):
            call()
    for command in ("ls", "inspect"):
        assert main([command, str(tmp_path)]) != 0
        assert message in capsys.readouterr().err


# A step's condition in a generated run.
COMMITTED, UNINDEXED, MARKER_REMOVED, NEVER_COMMITTED, ENTRY_ONLY = (
    "committed", "committed, not indexed", "marker removed, entry left", "files and entry, no marker",
    "entry of a removed step")
CONDITIONS = (COMMITTED, UNINDEXED, MARKER_REMOVED, NEVER_COMMITTED, ENTRY_ONLY)


def _build(run: Path, conditions: list[str]) -> set[int]:
    """A run whose step ``i + 1`` is in condition ``conditions[i]``; its truly committed steps."""
    committed = set()
    save_checkpoint(_state(0.0), str(run), 0)
    committed.add(0)
    for step, condition in enumerate(conditions, start=1):
        if condition == NEVER_COMMITTED:
            _uncommitted_attempt(run, step, 0)
            continue
        save_checkpoint(_state(float(step)), str(run), step)
        if condition == COMMITTED:
            committed.add(step)
        elif condition == UNINDEXED:
            committed.add(step)
            for entry in _entries(run, step):
                entry.unlink()
        elif condition == MARKER_REMOVED:
            (run / step_dir_name(step) / MARKER).unlink()
        else:
            shutil.rmtree(run / step_dir_name(step))
    return committed


@settings(max_examples=25, deadline=None)
@given(conditions=st.lists(st.sampled_from(CONDITIONS), min_size=1, max_size=6), keep=st.integers(1, 4))
def test_index_and_markers_in_any_disagreement(tmp_path_factory, conditions: list[str], keep: int) -> None:
    """Listing, loading and keep= follow the markers, whatever the index says."""
    run = tmp_path_factory.mktemp("run")
    committed = _build(run, conditions)
    newest = max(committed)
    assert _steps(str(run)) == sorted(committed)
    assert _load(str(run)) == (newest, float(newest))
    uncommitted = {step for step, condition in enumerate(conditions, start=1) if condition == NEVER_COMMITTED}
    step = len(conditions) + 1
    save_checkpoint(_state(float(step)), str(run), step, keep=keep)
    kept = sorted(committed)[-(keep - 1):] if keep > 1 else []
    assert _steps(str(run)) == [*kept, step]
    assert _load(str(run)) == (step, float(step))
    assert all((run / step_dir_name(s)).is_dir() for s in uncommitted)  # never touched


def test_on_s3_a_run_lists_from_listings_and_still_follows_its_markers(s3_bucket: str, monkeypatch) -> None:
    """On S3 a marker whose ETag is the MD5 its index entry recorded is the marker committed:
    listing reads no marker. One removed, or damaged, is found all the same."""
    import s3fs

    import dist_resume.checkpoint.marker as marker

    url, fs = f"{s3_bucket}/run", s3fs.S3FileSystem()
    root = url[len("s3://"):]
    for step in (1, 2, 3, 4):
        save_checkpoint(_state(float(step)), url, step)
    reads: list[str] = []
    original = marker.read_whole
    monkeypatch.setattr(marker, "read_whole", lambda loc, path, *a: (reads.append(path), original(loc, path, *a))[1])
    assert _steps(url) == [1, 2, 3, 4] and reads == []
    fs.rm_file(f"{root}/{step_dir_name(3)}/{MARKER}")  # its entry left behind
    fs.invalidate_cache()
    assert _steps(url) == [1, 2, 4] and reads == [f"{root}/{step_dir_name(3)}/{MARKER}"]
    fs.pipe_file(f"{root}/{step_dir_name(4)}/{MARKER}", b'{"step": 4, "world_size": "1", "committed_at": 1.0}')
    fs.invalidate_cache()
    message = f"step 4 at {url} is damaged: its commit marker has"
    with pytest.raises(CheckpointCorruptError, match=f"^{re.escape(message)}") as listed:
        list_checkpoints(url)
    with pytest.raises(CheckpointCorruptError) as loaded:
        read_loader_states(url)
    assert str(listed.value) == str(loaded.value)
