"""Each save's rank table (issue 24, point 10): a resume at another world size reads every
saved rank's progress from one table per field, not one DCP item per saved rank; the
loader's own entry stays whole; steps saved without a table load as before."""

from __future__ import annotations

import multiprocessing
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import dist_resume.checkpoint.bounded_reader as bounded_reader
import dist_resume.checkpoint.save as save_module
from dist_resume import ResumableDataLoader, load_checkpoint, read_loader_states, save_checkpoint
from dist_resume.checkpoint.rank_tables import entries_from_table
from dist_resume.state.fields import ResumeStateError
from dist_resume.state.rank_table import RANK_TABLE_KEY, decode_column, encode_column
from tests.hostile_files import read_metadata
from tests.layout import committed_dir
from tests.stream_jobs import all_items, flat, make_loader, make_stream, run_job, write_shards
from tests.unordered_datasets import Gated

LENGTH = 60


def _loader(rank: int, world_size: int, **kwargs) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(LENGTH)), batch_size=2, shuffle=True, seed=5, rank=rank,
                               world_size=world_size, **kwargs)


def _save_job(url: Path, world_size: int, steps: int) -> None:
    """One save of `world_size` ranks that each consumed `steps` batches (a lockstep job)."""
    merged: dict = {}
    for rank in range(world_size):
        loader = _loader(rank, world_size)
        iterator = iter(loader)
        for _ in range(steps):
            next(iterator)
        merged.update(loader.state_dict())
    save_checkpoint({"loader": merged}, str(url), 1)


def _reads(monkeypatch) -> list[str]:
    reads: list[str] = []
    original = bounded_reader.read_range

    def counted(loc, path, offset, length, where):
        reads.append(path)
        return original(loc, path, offset, length, where)

    monkeypatch.setattr(bounded_reader, "read_range", counted)
    return reads


def _served(loader: ResumableDataLoader) -> list[int]:
    return [index for batch in loader for index in batch.tolist()]


def test_an_elastic_load_reads_a_table_not_every_saved_rank(tmp_path: Path, monkeypatch) -> None:
    reads = _reads(monkeypatch)
    counts = []
    for saved_ranks in (3, 12):
        url = tmp_path / str(saved_ranks)
        _save_job(url, saved_ranks, 2)
        reads.clear()
        loader = _loader(0, 2)
        assert load_checkpoint({"loader": loader}, str(url)) == 1
        counts.append(len(reads))
        reference = _loader(0, 2)  # every saved rank's whole entry, as before tables
        reference.load_state_dict(read_loader_states(str(url))[1])
        served = _served(loader)
        assert served == _served(reference) and 0 < len(served) < LENGTH // 2
    assert counts[0] == counts[1]  # whatever the number of saved ranks
    assert counts[1] < 12


def test_a_same_size_resume_reads_its_own_whole_entry(tmp_path: Path) -> None:
    _save_job(tmp_path, 3, 4)
    for rank in range(3):
        loader, reference = _loader(rank, 3), _loader(rank, 3)
        load_checkpoint({"loader": loader}, str(tmp_path))
        reference.load_state_dict(read_loader_states(str(tmp_path))[1])
        served = _served(loader)
        assert served == _served(reference) and len(served) == LENGTH // 3 - 8


def test_a_step_saved_without_a_table_loads_every_ranks_entries(tmp_path: Path, monkeypatch) -> None:
    """Steps saved before rank tables: every saved rank's entry is read, as before."""
    with monkeypatch.context() as patch:
        patch.setattr(save_module, "with_rank_tables", lambda state, group: dict(state))
        _save_job(tmp_path, 3, 2)
    assert not any(RANK_TABLE_KEY in fqn for fqn in read_metadata(committed_dir(tmp_path, 1)).state_dict_metadata)
    reads = _reads(monkeypatch)
    loader, reference = _loader(0, 2), _loader(0, 2)
    load_checkpoint({"loader": loader}, str(tmp_path))
    reference.load_state_dict(read_loader_states(str(tmp_path))[1])
    served = _served(loader)
    assert served == _served(reference) and served
    assert len(reads) > 3  # an item per saved rank's entry


def test_holes_of_in_order_false_come_through_the_table(tmp_path: Path) -> None:
    """Two ranks each with a straggler (batch 0 held back, batch 1 delivered) resume at three
    ranks: every sample exactly once."""
    gates = [multiprocessing.Event(), multiprocessing.Event()]
    loaders = [ResumableDataLoader(Gated(40, {rank * 4 + 1}, gates[rank]), batch_size=4, num_workers=2,
                                   in_order=False, seed=3, shuffle=False, rank=rank, world_size=2)
               for rank in range(2)]
    iterators = [iter(loader) for loader in loaders]
    delivered = [int(i) for iterator in iterators for i in next(iterator)[0]]
    merged: dict = {}
    for loader in loaders:
        merged.update(loader.state_dict())
    for gate in gates:
        gate.set()
    del iterators
    save_checkpoint({"loader": merged}, str(tmp_path), 1)
    after = []
    for rank in range(3):
        resumed = ResumableDataLoader(Gated(40, set(), gates[0]), batch_size=2, in_order=False, seed=3,
                                      shuffle=False, rank=rank, world_size=3)
        load_checkpoint({"loader": resumed}, str(tmp_path))
        padding = resumed.padding_positions()
        indices = [int(i) for batch in resumed for i in batch[0]]
        for position in padding:
            indices.remove(position)
        after += indices
    counts = Counter(delivered + after)
    assert sorted(counts) == list(range(40)) and set(counts.values()) == {1}


def test_a_column_round_trips() -> None:
    rows = {0: torch.tensor([1, 2, 3]), 4: torch.tensor([], dtype=torch.int64), 7: torch.tensor([9])}
    column = encode_column(rows)
    assert column.tolist() == [3, 0, 4, 7, 3, 0, 1, 1, 2, 3, 9]
    assert {rank: value.tolist() for rank, value in decode_column(column, "c").items()} == {0: [1, 2, 3], 4: [], 7: [9]}


@pytest.mark.parametrize("values, problem", [
    ([], "c is not a non-empty 1-D int64 tensor"),
    ([0], "c says it holds 0 ranks in 1 values"),
    ([2**62, 0, 0], f"c says it holds {2**62} ranks in 3 values"),
    ([1, 0, 2**62, 5], "c is damaged: its lengths do not add up to the values it holds"),
    ([2, 0, 1, 2**62, -(2**62) + 1, 5], "c is damaged: its lengths do not add up to the values it holds"),
    ([2, 1, 1, 0, 0], "c is damaged: its ranks are not distinct, ascending and below 1048576"),
    ([1, -1, 0], "c is damaged: its ranks are not distinct, ascending and below 1048576"),
])
def test_a_damaged_column_is_one_error(values: list[int], problem: str) -> None:
    with pytest.raises(ResumeStateError, match=f"^{re.escape(problem)}$"):
        decode_column(torch.tensor(values, dtype=torch.int64), "c")


def test_a_table_entry_never_replaces_a_loaded_whole_entry() -> None:
    own = {"progress": torch.tensor([7])}
    table = {"progress": encode_column({0: torch.tensor([1]), 1: torch.tensor([2])})}
    merged = entries_from_table({RANK_TABLE_KEY: table, "rank_1": own, "plan": torch.tensor([])})
    assert merged["rank_0"]["progress"].tolist() == [1] and merged["rank_1"] is own and "plan" in merged
    assert RANK_TABLE_KEY not in merged


def test_a_stream_resumes_at_another_world_size_through_the_table(tmp_path: Path, monkeypatch) -> None:
    """A ShardedStream's position of every saved rank comes from the table: 2 ranks saved,
    3 resume, every item once; a read per field, not per saved rank."""
    urls = write_shards(str(tmp_path / "shards"))
    stream = make_stream(urls)
    before, state = run_job(stream, 2, 0, None, 3)
    save_checkpoint({"loader": state}, str(tmp_path / "run"), 1)
    reads = _reads(monkeypatch)
    after, counts = [], []
    for rank in range(3):
        reads.clear()
        loader = make_loader(stream, rank, 3, 0)
        load_checkpoint({"loader": loader}, str(tmp_path / "run"))
        counts.append(len(reads))
        after.append([item for batch in loader for item in batch.tolist()])
    assert flat(before + after) == all_items()
    # the table's progress, stream meta and canonical columns, and the 3 fields of the own entry (rank 2 has none)
    assert counts == [6, 6, 3]


def test_skipped_ranges_come_through_the_table(tmp_path: Path) -> None:
    merged: dict = {}
    for rank in range(2):
        loader = _loader(rank, 2)
        loader.skip(3)
        iterator = iter(loader)
        next(iterator)
        merged.update(loader.state_dict())
    save_checkpoint({"loader": merged}, str(tmp_path), 1)
    loader, reference = _loader(0, 3), _loader(0, 3)
    load_checkpoint({"loader": loader}, str(tmp_path))
    reference.load_state_dict(merged)
    assert loader.skipped == reference.skipped and len(loader.skipped) == 1
    served = _served(loader)
    assert served == _served(reference) and served
