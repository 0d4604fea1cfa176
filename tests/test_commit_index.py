"""The index of committed steps (checkpoint/commit_index): finding the latest step and
listing a run cost listings, not a request per step; runs without it still load (G7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dist_resume.checkpoint.load import list_checkpoints, load_checkpoint
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name
from dist_resume.storage import CheckpointStore

STEPS = (3, 7, 12, 20, 31)


def _state(value: float) -> dict:
    return {"weights": torch.full((4,), value)}


def _save_run(url: str) -> None:
    for step in STEPS:
        save_checkpoint(_state(float(step)), url, step)


def _load(url: str) -> tuple[int | None, torch.Tensor]:
    state = _state(0.0)
    step = load_checkpoint(state, url)
    return step, state["weights"]


class _Requests:
    """Counts the per-step requests a store makes: marker checks and tree listings."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.exists: list[str] = []
        self.tree_size: list[str] = []
        for name in ("exists", "tree_size"):
            for store_class in CheckpointStore.__subclasses__():
                original = getattr(store_class, name)
                monkeypatch.setattr(store_class, name, self._counting(name, original))

    def _counting(self, name, original):
        def counted(store, path, *args, **kwargs):
            getattr(self, name).append(path)
            return original(store, path, *args, **kwargs)

        return counted


def _entry(run: Path, step: int) -> Path:
    (entry,) = (run / ".commits").glob(f"{step_dir_name(step)}*")
    return entry


def test_listing_an_indexed_run_reads_markers_only(tmp_path: Path, monkeypatch) -> None:
    """list_checkpoints reads each step's marker (what commits it, as for a load) and takes
    the size of its files from the index entry's name: no entry is read, no step measured."""
    _save_run(str(tmp_path))
    import dist_resume.checkpoint.commit_index as commit_index
    import dist_resume.checkpoint.marker as marker

    reads: list[str] = []
    for module in (commit_index, marker):
        original = module.read_whole
        monkeypatch.setattr(module, "read_whole", lambda loc, path, *a, original=original: (
            reads.append(path), original(loc, path, *a))[1])
    requests = _Requests(monkeypatch)
    infos = list_checkpoints(str(tmp_path))
    assert sorted(reads) == [str(tmp_path / step_dir_name(step) / MARKER) for step in STEPS]
    assert requests.tree_size == []
    assert [(info.step, info.world_size) for info in infos] == [(step, 1) for step in STEPS]
    for info in infos:
        assert (info.committed_at, info.size_bytes) == _committed_info(tmp_path / step_dir_name(info.step))


def _committed_info(directory: Path) -> tuple[float, int]:
    marker = json.loads((directory / MARKER).read_text())
    return marker["committed_at"], sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_latest_step_reads_one_marker_and_listing_measures_no_step(tmp_path: Path, monkeypatch) -> None:
    """The load reads the newest step's marker only; it checks that each step's marker is
    there (what this job found committed, for a later save that finds its step taken: one
    listing on S3). The listing takes sizes from the index entries' names."""
    _save_run(str(tmp_path))
    requests = _Requests(monkeypatch)
    import dist_resume.checkpoint.marker as marker

    reads: list[str] = []
    original = marker.read_whole
    monkeypatch.setattr(marker, "read_whole", lambda loc, path, *a: (reads.append(path), original(loc, path, *a))[1])
    step, weights = _load(str(tmp_path))
    assert step == 31 and torch.equal(weights, torch.full((4,), 31.0))
    assert reads == [str(tmp_path / step_dir_name(31) / MARKER)]
    assert sorted(requests.exists) == [str(tmp_path / step_dir_name(step) / MARKER) for step in STEPS]
    infos = list_checkpoints(str(tmp_path))
    assert requests.tree_size == []
    assert [info.step for info in infos] == list(STEPS)
    for info in infos:
        assert (info.committed_at, info.size_bytes) == _committed_info(tmp_path / step_dir_name(info.step))


def test_a_run_saved_before_the_index_loads_and_lists_the_same(tmp_path: Path, monkeypatch) -> None:
    _save_run(str(tmp_path))
    indexed = list_checkpoints(str(tmp_path))
    for entry in (tmp_path / ".commits").iterdir():
        entry.unlink()
    (tmp_path / ".commits").rmdir()
    requests = _Requests(monkeypatch)
    assert list_checkpoints(str(tmp_path)) == indexed
    assert len(requests.tree_size) == len(STEPS)  # its files measured, as before the index
    assert _load(str(tmp_path))[0] == 31


def test_a_step_committed_but_not_indexed_still_counts(tmp_path: Path) -> None:
    """A crash between the marker and its index entry leaves a committed step unindexed."""
    _save_run(str(tmp_path))
    _entry(tmp_path, 31).unlink()
    assert _load(str(tmp_path))[0] == 31
    assert [info.step for info in list_checkpoints(str(tmp_path))] == list(STEPS)


def test_an_entry_whose_step_directory_is_gone_is_ignored(tmp_path: Path) -> None:
    """Pruning removes an entry first; a step removed by hand leaves one behind, which names
    no step, and a new save of that step replaces it."""
    _save_run(str(tmp_path))
    import shutil

    shutil.rmtree(tmp_path / step_dir_name(31))
    assert _load(str(tmp_path))[0] == 20
    save_checkpoint(_state(99.0), str(tmp_path), 31)
    assert _load(str(tmp_path))[0] == 31
    assert list_checkpoints(str(tmp_path))[-1].size_bytes == _committed_info(tmp_path / step_dir_name(31))[1]


def test_keep_removes_index_entries_with_their_steps(tmp_path: Path) -> None:
    for step in STEPS:
        save_checkpoint(_state(float(step)), str(tmp_path), step, keep=2)
    assert sorted(p.name.split(".")[0] for p in (tmp_path / ".commits").iterdir()) == [step_dir_name(20),
                                                                                         step_dir_name(31)]


@pytest.mark.parametrize("content", [
    b"{not json",
    json.dumps({"step": 31, "world_size": 1, "committed_at": 1.0, "size_bytes": -5}).encode(),
    json.dumps({"step": 30, "world_size": 1, "committed_at": 1.0, "size_bytes": 5}).encode(),
])
def test_a_damaged_index_entry_is_ignored(tmp_path: Path, content: bytes) -> None:
    """An entry of the form written before names said more is read (one request); one that
    is damaged, or not of the step's commit, is ignored: the step's files are measured."""
    _save_run(str(tmp_path))
    _entry(tmp_path, 31).unlink()
    (tmp_path / ".commits" / step_dir_name(31)).write_bytes(content)
    infos = list_checkpoints(str(tmp_path))
    assert [info.step for info in infos] == list(STEPS)
    assert (infos[-1].committed_at, infos[-1].size_bytes) == _committed_info(tmp_path / step_dir_name(31))
    assert _load(str(tmp_path))[0] == 31


def test_an_entry_of_another_commit_of_the_step_is_not_believed(tmp_path: Path) -> None:
    """A step removed by hand and saved again by a job whose index write failed: the old
    entry names another commit, and its size is not reported."""
    _save_run(str(tmp_path))
    stale = _entry(tmp_path, 31).read_bytes(), _entry(tmp_path, 31).name
    import shutil

    shutil.rmtree(tmp_path / step_dir_name(31))
    save_checkpoint({"weights": torch.zeros(1000)}, str(tmp_path), 31)
    _entry(tmp_path, 31).unlink()
    (tmp_path / ".commits" / stale[1]).write_bytes(stale[0])
    info = list_checkpoints(str(tmp_path))[-1]
    assert (info.committed_at, info.size_bytes) == _committed_info(tmp_path / step_dir_name(31))


@pytest.mark.parametrize("folder", ["/run", ""], ids=["in a folder", "at the bucket's top"])
def test_s3_run_loads_and_lists_without_a_request_per_step(s3_bucket: str, monkeypatch, folder: str) -> None:
    url = f"{s3_bucket}{folder}"
    _save_run(url)
    requests = _Requests(monkeypatch)
    import dist_resume.checkpoint.marker as marker

    reads: list[str] = []
    original = marker.read_whole
    monkeypatch.setattr(marker, "read_whole", lambda loc, path, *a: (reads.append(path), original(loc, path, *a))[1])
    assert _load(url)[0] == 31
    assert len(reads) == 1  # the newest step's marker
    assert [info.step for info in list_checkpoints(url)] == list(STEPS)
    assert requests.exists == [] and requests.tree_size == [] and len(reads) == 1
