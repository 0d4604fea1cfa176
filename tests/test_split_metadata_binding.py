"""The split metadata of a step is bound to its commit (issue 33): a rank that needs its own
record finds exactly one, and split files that differ from what the save wrote, even in a
way consistent with themselves (two model tensors' ranges swapped, a record left out or
renamed), are one CheckpointCorruptError, not another training order or swapped weights."""

from __future__ import annotations

import json
import pickle
import re
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import RandomSampler

from dist_resume import ResumableDataLoader, load_checkpoint, save_checkpoint
from dist_resume.checkpoint.split_metadata import RANK_ENTRIES, SHARED
from dist_resume.errors import CheckpointCorruptError, UnsafeCheckpointError

from tests.layout import committed_dir

MAGICS = {struct.unpack("<q", name)[0]: name for name in (b"DRANKMD1", b"DRANKMD2")}


def _sampled(rank: int, world_size: int) -> ResumableDataLoader:
    """A loader whose rank entries hold an own field (its sampler's generator)."""
    return ResumableDataLoader(list(range(30)), sampler=RandomSampler(range(30), generator=torch.Generator()),
                               batch_size=2, rank=rank, world_size=world_size)


def _batches(loader: ResumableDataLoader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def _model() -> dict[str, torch.Tensor]:
    return {"a": torch.full((4, 4), 1.0), "b": torch.full((4, 4), 2.0), "c": torch.arange(5.0)}


def _save(url: Path, world_size: int = 3) -> None:
    merged: dict = {}
    for rank in range(world_size):
        loader = _sampled(rank, world_size)
        batches = iter(loader)
        for _ in range(2):
            next(batches)
        merged.update(loader.state_dict())
    save_checkpoint({"model": _model(), "loader": merged}, str(url), 1)


def _load(url: Path, rank: int = 0, world_size: int = 3) -> tuple[dict[str, torch.Tensor], ResumableDataLoader]:
    state = {"model": {name: torch.zeros_like(value) for name, value in _model().items()},
             "loader": _sampled(rank, world_size)}
    load_checkpoint(state, str(url))
    return state["model"], state["loader"]


def _parse(data: bytes) -> tuple[bytes, list[int], list[bytes], list[int]]:
    """The rank-entries file: its magic, ranks, records, and per-record sums (if its layout has them)."""
    magic, count = struct.unpack_from("<2q", data)
    name = MAGICS[magic]
    words = 3 if name == b"DRANKMD2" else 2
    header = struct.unpack_from(f"<{words * count}q", data, 16)
    ranks, ends = list(header[:count]), header[count:2 * count]
    sums = list(header[2 * count:])
    start = 16 + 8 * words * count
    return name, ranks, [data[start + begin:start + end] for begin, end in zip((0, *ends), ends)], sums


def _unparse(name: bytes, ranks: list[int], records: list[bytes], sums: list[int]) -> bytes:
    ends, at = [], 0
    for record in records:
        at += len(record)
        ends.append(at)
    words = [*ranks, *ends, *(sums if name == b"DRANKMD2" else ())]
    return struct.pack(f"<2q{len(words)}q", struct.unpack("<q", name)[0], len(ranks), *words) + b"".join(records)


def _record_sum(record: bytes) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(record, digest_size=8).digest(), "little", signed=True)


def _rename_rank(record: bytes, old: str, new: str) -> bytes:
    metadata = pickle.loads(record)
    for table in (metadata.state_dict_metadata, metadata.planner_data):
        for fqn in list(table):
            value = table.pop(fqn)
            if isinstance(value, tuple):
                value = tuple(new if part == old else part for part in value)
            table[fqn.replace(f".{old}.", f".{new}.")] = value
    for index in metadata.storage_data:
        object.__setattr__(index, "fqn", index.fqn.replace(f".{old}.", f".{new}."))
    return pickle.dumps(metadata)


def _leave_out_rank_0(name, ranks, records, sums):
    keep = [i for i, rank in enumerate(ranks) if rank != 0]
    return name, [ranks[i] for i in keep], [records[i] for i in keep], [sums[i] for i in keep] if sums else []


def _no_records(name, ranks, records, sums):
    return name, [], [], []


def _renamed_rank_0(name, ranks, records, sums):
    records = [_rename_rank(record, "rank_0", "rank_00") if rank == 0 else record
               for rank, record in zip(ranks, records)]
    return name, ranks, records, [_record_sum(record) for record in records] if sums else []


EDITS = {"rank 0's record left out": _leave_out_rank_0, "no records at all": _no_records,
         "rank 0's record renamed rank_00": _renamed_rank_0}


def _edit_records(url: Path, edit) -> None:
    path = committed_dir(url, 1) / RANK_ENTRIES
    path.write_bytes(_unparse(*edit(*_parse(path.read_bytes()))))


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_a_rank_that_needs_its_own_record_and_does_not_find_it_is_refused(tmp_path: Path, edit: str) -> None:
    """The records file rewritten consistently with itself: rank 0 must not load another order."""
    _save(tmp_path)
    _edit_records(tmp_path, EDITS[edit])
    with pytest.raises(CheckpointCorruptError, match=f"^step 1 at {re.escape(str(tmp_path))} is damaged: "):
        _load(tmp_path)


def _without_recorded_digests(url: Path) -> None:
    """The step's marker as if its digests had been lost: the structure alone must hold."""
    marker = committed_dir(url, 1).parent / ".committed"
    fields = json.loads(marker.read_text())
    fields.pop("digests", None)
    marker.write_text(json.dumps(fields))


@pytest.mark.parametrize("edit, problem", [
    ("rank 0's record left out", f"{RANK_ENTRIES} lists ranks other than 0 to 2, the saved ranks"),
    ("no records at all", f"{RANK_ENTRIES} lists ranks other than 0 to 2, the saved ranks"),
    ("rank 0's record renamed rank_00", f"rank 0's record in {RANK_ENTRIES} holds other entries than that rank's"),
])
def test_every_saved_rank_has_exactly_one_record_whatever_the_marker_says(tmp_path: Path, edit: str,
                                                                         problem: str) -> None:
    _save(tmp_path)
    _without_recorded_digests(tmp_path)
    _edit_records(tmp_path, EDITS[edit])
    with pytest.raises(CheckpointCorruptError, match=f"^{re.escape(f'step 1 at {tmp_path} is damaged: {problem}')}$"):
        _load(tmp_path)


def _swap_ranges(metadata, first: str, second: str) -> None:
    (a,) = [index for index in metadata.storage_data if index.fqn == first]
    (b,) = [index for index in metadata.storage_data if index.fqn == second]
    metadata.storage_data[a], metadata.storage_data[b] = metadata.storage_data[b], metadata.storage_data[a]


def test_split_files_consistent_with_themselves_but_not_with_the_metadata_are_refused(tmp_path: Path) -> None:
    """Two same-shape model tensors' ranges swapped in the shared file: the weights would
    load swapped. The commit recorded what the save wrote."""
    _save(tmp_path)
    path = committed_dir(tmp_path, 1) / SHARED
    shared = pickle.loads(path.read_bytes())
    _swap_ranges(shared, "model.a", "model.b")
    path.write_bytes(pickle.dumps(shared))
    message = (f"step 1 at {tmp_path} is damaged: its {SHARED} is not the one its commit recorded (changed, or "
               "taken from another save, after the commit)")
    with pytest.raises(CheckpointCorruptError, match=f"^{re.escape(message)}$"):
        _load(tmp_path)


def test_a_whole_metadata_changed_after_the_commit_is_refused(tmp_path: Path) -> None:
    """The same swap in .metadata, read by read_loader_states, inspect and a load into a plain dict."""
    _save(tmp_path)
    path = committed_dir(tmp_path, 1) / ".metadata"
    metadata = pickle.loads(path.read_bytes())
    _swap_ranges(metadata, "model.a", "model.b")
    path.write_bytes(pickle.dumps(metadata))
    state = {"model": {name: torch.zeros_like(value) for name, value in _model().items()}, "loader": {}}
    message = (f"step 1 at {tmp_path} is damaged: its .metadata is not the one its commit recorded (changed, or "
               "taken from another save, after the commit)")
    with pytest.raises(CheckpointCorruptError, match=f"^{re.escape(message)}$"):
        load_checkpoint(state, str(tmp_path))


def test_the_untouched_step_loads_what_was_saved(tmp_path: Path) -> None:
    _save(tmp_path)
    model, loader = _load(tmp_path)
    reference = _sampled(0, 3)
    batches = iter(reference)
    for _ in range(2):
        next(batches)
    assert all(torch.equal(model[name], value) for name, value in _model().items())
    assert _batches(loader) == [batch.tolist() for batch in batches] and _batches(loader)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_change_to_a_split_file_is_the_saved_load_or_one_error(tmp_path_factory, data) -> None:
    """Bytes of either split file replaced at random (the marker kept): the load gives what
    was saved (the change missed what rank 1 reads) or one error; never other values."""
    url = tmp_path_factory.mktemp("run")
    _save(url)
    name = data.draw(st.sampled_from([SHARED, RANK_ENTRIES]))
    path = committed_dir(url, 1) / name
    original = path.read_bytes()
    at = data.draw(st.integers(0, 2**20)) % len(original)  # the files' lengths vary with the save's id
    replaced = data.draw(st.binary(min_size=1, max_size=16))
    changed = original[:at] + replaced + original[at + len(replaced):]
    path.write_bytes(changed)
    try:
        model, loader = _load(url, rank=1)
    except (CheckpointCorruptError, UnsafeCheckpointError):
        return
    reference = _sampled(1, 3)
    batches = iter(reference)
    for _ in range(2):
        next(batches)
    assert all(torch.equal(model[key], value) for key, value in _model().items())
    assert _batches(loader) == [batch.tolist() for batch in batches]
