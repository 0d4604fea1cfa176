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
from torch.utils.data import RandomSampler

import dist_resume.checkpoint.bounded_reader as bounded_reader
import dist_resume.checkpoint.save as save_module
from dist_resume import ResumableDataLoader, load_checkpoint, read_loader_states, save_checkpoint
from dist_resume.checkpoint.entry_fields import OWN_FIELDS, SHARED_FIELDS, check_entry_fields
from dist_resume.checkpoint.rank_tables import entries_from_table
from dist_resume.errors import CheckpointError
from dist_resume.state.fields import ResumeStateError
from dist_resume.state.rank_table import RANK_TABLE_KEY, decode_column, encode_column
from tests.hostile_files import read_metadata
from tests.layout import committed_dir
from tests.merged_states import merged_from
from tests.mixture_datasets import mixture
from tests.stream_jobs import all_items, flat, make_loader, make_stream, run_job, write_shards
from tests.stream_mixture_jobs import make_mixture, write_sources
from tests.tutorial_datasets import MyIterableDataset, MySampler, NoisyRange
from tests.unordered_datasets import Gated

LENGTH = 60


def _loader(rank: int, world_size: int, **kwargs) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(LENGTH)), batch_size=2, shuffle=True, seed=5, rank=rank,
                               world_size=world_size, **kwargs)


def _taken(make, world_size: int, steps: int, before=lambda loader: None) -> dict:
    """The merged state of a lockstep job whose ranks' loaders, `make(rank, world_size)`,
    each went through `before` and then consumed `steps` batches."""
    merged: dict = {}
    for rank in range(world_size):
        loader = make(rank, world_size)
        before(loader)
        iterator = iter(loader)
        for _ in range(steps):
            next(iterator)
        merged.update(loader.state_dict())
    return merged


def _save_job(url: Path, world_size: int, steps: int) -> None:
    """One save of `world_size` ranks that each consumed `steps` batches (a lockstep job)."""
    save_checkpoint({"loader": _taken(_loader, world_size, steps)}, str(url), 1)


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


def _straggling_job() -> tuple[dict, list[int]]:
    """Two in_order=False ranks whose batch 0 waits at a gate while each delivers its batch 1:
    their merged state, taken with batch 0 still in flight, and the samples delivered. The
    gates are open on return, so the held workers can finish."""
    gates = [multiprocessing.Event(), multiprocessing.Event()]
    loaders = [ResumableDataLoader(Gated(40, {rank * 4 + 1}, gates[rank]), batch_size=4, num_workers=2,
                                   in_order=False, seed=3, shuffle=False, rank=rank, world_size=2)
               for rank in range(2)]
    iterators = [iter(loader) for loader in loaders]
    delivered = [int(i) for iterator in iterators for i in next(iterator)[0]]
    merged = merged_from(loaders)
    for gate in gates:
        gate.set()
    del iterators
    return merged, delivered


def test_holes_of_in_order_false_come_through_the_table(tmp_path: Path) -> None:
    """Two ranks each with a straggler (batch 0 held back, batch 1 delivered) resume at three
    ranks: every sample exactly once."""
    merged, delivered = _straggling_job()
    save_checkpoint({"loader": merged}, str(tmp_path), 1)
    after = []
    for rank in range(3):
        resumed = _holes(rank, 3)
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


def test_a_table_entry_never_replaces_a_field_of_a_loaded_entry() -> None:
    own = {"progress": torch.tensor([7]), "stream": {"items": torch.tensor([3])}}
    table = {"progress": encode_column({0: torch.tensor([1]), 1: torch.tensor([2])}),
             "stream": {"meta": encode_column({0: torch.tensor([4]), 1: torch.tensor([5])})}}
    merged = entries_from_table({RANK_TABLE_KEY: table, "rank_1": own, "plan": torch.tensor([])})
    assert merged["rank_0"]["progress"].tolist() == [1] and merged["rank_0"]["stream"]["meta"].tolist() == [4]
    assert merged["rank_1"]["progress"].tolist() == [7] and "plan" in merged
    assert RANK_TABLE_KEY not in merged
    # a loaded entry of the own fields only (a step with split metadata): the table gives the rest
    merged = entries_from_table({RANK_TABLE_KEY: table, "rank_1": {"stream": {"items": torch.tensor([3])}}})
    assert {name: value.tolist() for name, value in merged["rank_1"]["stream"].items()} == {"meta": [5], "items": [3]}
    assert merged["rank_1"]["progress"].tolist() == [2]


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
    # the table's progress, stream meta and canonical columns; the own entries hold no field
    # that the table lacks, so none is read again (split metadata)
    assert counts == [3, 3, 3]


def test_skipped_ranges_come_through_the_table(tmp_path: Path) -> None:
    merged = _taken(_loader, 2, 1, lambda loader: loader.skip(3))
    save_checkpoint({"loader": merged}, str(tmp_path), 1)
    loader, reference = _loader(0, 3), _loader(0, 3)
    load_checkpoint({"loader": loader}, str(tmp_path))
    reference.load_state_dict(merged)
    assert loader.skipped == reference.skipped and len(loader.skipped) == 1
    served = _served(loader)
    assert served == _served(reference) and served


def _stream_entry_with(name: str) -> dict:
    entry = _loader(0, 1).state_dict()
    entry["rank_0"]["stream"] = {"meta": torch.zeros(4, dtype=torch.int64), "snapshot_3": {"a": 1}, name: 1}
    return entry


@pytest.mark.parametrize("state, field", [
    ({**_loader(0, 1).state_dict(), "rank_0": {**_loader(0, 1).state_dict()["rank_0"], "progress_2": torch.zeros(1)}},
     "loader.rank_0.progress_2"),
    (_stream_entry_with("positions"), "loader.rank_0.stream.positions"),
    (_stream_entry_with("snapshot_x"), "loader.rank_0.stream.snapshot_x"),
])
def test_a_field_declared_neither_shared_nor_own_is_refused_before_anything_is_written(
        tmp_path: Path, state: dict, field: str) -> None:
    with pytest.raises(CheckpointError, match=f"^cannot save step 1: data loader field {re.escape(repr(field))} is declared "
                       "neither shared by every rank's load nor read by its own rank only .*, so a load at another "
                       "world size would lose it; this is a dist_resume bug, please report it$"):
        save_checkpoint({"loader": state}, str(tmp_path / "run"), 1)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*"))


def test_a_shared_field_that_is_not_an_int64_vector_is_refused() -> None:
    state = _loader(0, 1).state_dict()
    state["rank_0"]["skipped"] = torch.zeros((1, 2), dtype=torch.int64)
    with pytest.raises(CheckpointError, match="^data loader field 'loader.rank_0.skipped' is shared by "
                       "every rank's load but is not a 1-D int64 tensor; this is a dist_resume bug"):
        check_entry_fields({"loader": state})


def test_every_declared_field_is_either_shared_or_own() -> None:
    assert not set(SHARED_FIELDS) & set(OWN_FIELDS)
    assert len(set(SHARED_FIELDS)) == len(SHARED_FIELDS)


def _plain(value):
    """``value`` with tensors as lists, for comparing loaded states and batches."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _map_style(rank: int, world_size: int) -> ResumableDataLoader:
    return _loader(rank, world_size)


def _mixture(rank: int, world_size: int) -> ResumableDataLoader:
    return ResumableDataLoader(mixture(), batch_size=2, shuffle=True, seed=3, rank=rank, world_size=world_size)


def _custom_sampler(rank: int, world_size: int) -> ResumableDataLoader:
    """A stateful sampler and a stateful dataset (fields 'sampler' and 'dataset')."""
    return ResumableDataLoader(NoisyRange(5, 1, 1), sampler=MySampler(5, 1, 10), batch_size=2, rank=rank,
                               world_size=world_size, deterministic_transforms=False)


def _random_sampler(rank: int, world_size: int) -> ResumableDataLoader:
    """A sampler drawing from a generator (field 'sampler_rng')."""
    return ResumableDataLoader(list(range(30)), sampler=RandomSampler(range(30), generator=torch.Generator()),
                               batch_size=2, rank=rank, world_size=world_size)


def _snapshots(rank: int, world_size: int) -> ResumableDataLoader:
    """An IterableDataset other than ShardedStream (fields 'items', 'of_iterator', 'snapshot_<role>')."""
    return ResumableDataLoader(MyIterableDataset(13, rank * 100), batch_size=2, snapshot_every=2, rank=rank,
                               world_size=world_size)


def _holes(rank: int, world_size: int) -> ResumableDataLoader:
    return ResumableDataLoader(Gated(40, set(), None), batch_size=2, in_order=False, seed=3, shuffle=False,
                               rank=rank, world_size=world_size)


def _holes_saved() -> dict:
    """Two ranks that each delivered batch 1 of their in_order=False order before batch 0 (a hole)."""
    merged, _ = _straggling_job()
    assert all(len(merged[f"rank_{rank}"]["delivered__load_with_dist_resume_load_checkpoint"]) > 1 for rank in range(2))
    return merged


def _case(kind: str, tmp_path: Path):
    """(the merged state of a saved job, the loader maker, the world size that loads it)."""
    if kind == "map-style":
        return _taken(_map_style, 2, 3), _map_style, 3
    if kind == "skips":
        return _taken(_map_style, 2, 1, lambda loader: loader.skip(3)), _map_style, 3
    if kind == "mixture":
        return _taken(_mixture, 2, 3), _mixture, 3
    if kind == "holes":
        return _holes_saved(), _holes, 3
    if kind in ("stream", "stream-unordered", "stream-mixture"):
        if kind == "stream-mixture":
            urls = write_sources(str(tmp_path / "sources"))
            source = make_mixture(urls, mixed=True)
            batch, in_order, options = {2: 6, 3: 4}, True, {"shuffle": True, "seed": 3}
        else:
            source = make_stream(write_shards(str(tmp_path / "shards")))
            batch, in_order, options = {2: 4, 3: 4}, kind == "stream", {}

        def make(rank: int, world_size: int) -> ResumableDataLoader:
            return ResumableDataLoader(source, batch_size=batch[world_size], rank=rank, world_size=world_size,
                                       even_batches=False, in_order=in_order, **options)

        return _taken(make, 2, 3), make, 3
    # Resumed only at the saved world size (their fields are per worker copy); the other
    # ranks' entries still come through the table.
    if kind == "custom-sampler":
        return _taken(_custom_sampler, 2, 1), _custom_sampler, 2
    if kind == "random-sampler":
        return _taken(_random_sampler, 2, 2), _random_sampler, 2
    assert kind == "iterable-snapshots"
    return _taken(_snapshots, 2, 3), _snapshots, 2


KINDS = ["map-style", "skips", "mixture", "holes", "stream", "stream-unordered", "stream-mixture", "custom-sampler",
         "random-sampler", "iterable-snapshots"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_loader_kind_saves_and_loads_through_the_table_as_its_full_state(tmp_path: Path, kind: str) -> None:
    """Each kind of loader the library has: the save accepts its fields (each declared), and a
    load through the rank table equals `load_state_dict` of every saved rank's whole entry."""
    merged, make, world_size = _case(kind, tmp_path)
    save_checkpoint({"loader": merged}, str(tmp_path / "run"), 1)
    fields = {path for entry in merged.values() if isinstance(entry, dict) for path in _paths(entry)}
    for rank in range(world_size):
        loader, reference = make(rank, world_size), make(rank, world_size)
        assert load_checkpoint({"loader": loader}, str(tmp_path / "run")) == 1
        reference.load_state_dict(merged)
        assert _plain(loader.state_dict()) == _plain(reference.state_dict())
        served = [_plain(batch) for batch in loader]
        assert served == [_plain(batch) for batch in reference] and served
    assert fields >= _KIND_FIELDS[kind]


_KIND_FIELDS = {
    "map-style": {("progress",)}, "skips": {("skipped",)}, "mixture": {("progress",)},
    "holes": {("delivered__load_with_dist_resume_load_checkpoint",)},
    "stream": {("stream", "canonical")}, "stream-mixture": {("stream", "canonical")},
    "stream-unordered": {("stream", "unordered"), ("stream", "runs__load_with_dist_resume_load_checkpoint")},
    "custom-sampler": {("sampler",), ("dataset",)}, "random-sampler": {("sampler_rng",)},
    "iterable-snapshots": {("stream", "items"), ("stream", "of_iterator"), ("stream", "snapshot_0")},
}


def _paths(entry: dict) -> set[tuple[str, ...]]:
    return {(name,) for name in entry} | {("stream", name) for name in entry.get("stream", {})}
