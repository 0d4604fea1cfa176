"""in_order=False over a ShardedStream: each worker reads whole batches of its own run of
items and the loader hands on whichever arrives first; a resume, at the same or another
num_workers, world size or batch size, trains every item of the epoch exactly once (G1 for
in_order=False, G2), and states move between in_order=False and in_order=True loaders when
that is exact (G6)."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import re
from collections import Counter

import fsspec
import pytest

from dist_resume import ResumableDataLoader, ResumeStateError
from dist_resume.streams import ShardedStream
from tests.stream_jobs import all_items, make_stream, run_ranks, write_shards
from tests.unordered_datasets import GatedReader, WorkerSplit


@pytest.fixture
def urls(tmp_path) -> list[str]:
    return write_shards(str(tmp_path))


def loader_of(stream: ShardedStream, rank: int = 0, world_size: int = 1, num_workers: int = 0, *,
              batch_size: int = 4, in_order: bool = False, **options) -> ResumableDataLoader:
    options.setdefault("even_batches", False)  # no padding: "exactly once" is the whole epoch
    return ResumableDataLoader(stream, batch_size=batch_size, num_workers=num_workers, rank=rank,
                               world_size=world_size, in_order=in_order, **options)


def job(stream, world_size, num_workers, state, steps, **options) -> tuple[list[int], dict]:
    """Every rank loads `state` and takes `steps` batches (None: to the epoch's end); the
    items consumed, and the merged state of every rank (what load_checkpoint hands on)."""
    per_rank, merged = run_ranks(lambda rank: loader_of(stream, rank, world_size, num_workers, **options),
                                 world_size, state, steps)
    return [item for items in per_rank for item in items], merged


@pytest.mark.parametrize("workers_before, workers_after", [(0, 2), (2, 0), (2, 3)])
def test_in_order_false_on_a_sharded_stream_resumes_every_item_exactly_once(urls, workers_before, workers_after):
    stream = make_stream(urls)
    before, state = job(stream, 1, workers_before, None, 7)
    after, _ = job(stream, 1, workers_after, state, None)
    assert len(before) == 28
    assert sorted(before + after) == all_items()


def test_elastic_resumes_consume_every_item_once_per_epoch(urls):
    stream = make_stream(urls)
    consumed, state = [], None
    for world_size, num_workers, steps, batch_size in [(2, 2, 5, 4), (3, 1, 3, 3), (1, 0, None, 5)]:
        items, state = job(stream, world_size, num_workers, state, steps, batch_size=batch_size)
        consumed += items
    assert sorted(consumed) == all_items()
    second, _ = job(stream, 2, 1, state, None)  # the next epoch: every item once more
    assert sorted(second) == all_items()


def test_an_unchanged_layout_without_workers_continues_exactly(urls):
    stream = make_stream(urls)
    whole = [batch.tolist() for batch in loader_of(stream, 1, 2)]
    loader = loader_of(stream, 1, 2)
    head = list(itertools.islice(loader, 3))
    resumed = loader_of(stream, 1, 2)
    resumed.load_state_dict(loader.state_dict())
    assert [batch.tolist() for batch in head] + [batch.tolist() for batch in resumed] == whole


def even_shards(root) -> list[str]:
    """4 shards of 8 items, shard s holding items s*1000 .. s*1000+7."""
    urls = []
    for shard in range(4):
        urls.append(f"{root}/even-{shard}.jsonl")
        with fsspec.open(urls[-1], "w") as file:
            file.writelines(json.dumps({"id": shard * 1000 + i}) + "\n" for i in range(8))
    return urls


def test_a_straggling_worker_is_overtaken_and_its_batches_are_not_lost(tmp_path):
    gate = multiprocessing.Event()
    # shuffle off, window 1: the epoch's items are the shards' in order. Worker role 0 reads
    # batches 0-3 (shards 0 and 1), whose first item waits for the gate; role 1 reads 4-7.
    stream = ShardedStream(even_shards(tmp_path), GatedReader({0}, gate), shuffle=False, window=1,
                           lengths=[8] * 4)  # counting would read the straggler
    loader = loader_of(stream, num_workers=2)
    iterator = iter(loader)
    first = next(iterator).tolist()
    state = loader.state_dict()
    gate.set()
    rest = [batch.tolist() for batch in iterator]
    assert first == [2000, 2001, 2002, 2003]
    assert sorted([first] + rest) == [[shard * 1000 + i for i in range(start, start + 4)]
                                      for shard in range(4) for start in (0, 4)]
    assert state["rank_0"]["stream"]["unordered"].tolist()[2:] == [0, 1]  # batches each role handed on
    assert state["rank_0"]["stream"]["runs__load_with_dist_resume_load_checkpoint"].tolist() == [0, 32]
    expected = sorted(shard * 1000 + i for shard in range(4) for i in range(8) if first.count(shard * 1000 + i) == 0)
    for world_size, batch_size, num_workers in [(1, 4, 2), (1, 3, 0), (3, 2, 1)]:
        after, _ = job(stream, world_size, num_workers, state, None, batch_size=batch_size)
        assert sorted(after) == expected


@pytest.mark.parametrize("drop_last, even_batches", [(True, True), (False, True)])
def test_ranks_get_the_same_number_of_batches_and_the_tail_follows_its_mode(urls, drop_last, even_batches):
    stream = make_stream(urls)
    before, state = job(stream, 2, 2, None, 3, drop_last=drop_last, even_batches=even_batches)
    counts, consumed = [], []
    for rank in range(3):  # 178 - 24 items left: 12 full global steps of 12 and 10 items
        loader = loader_of(stream, rank, 3, 1, drop_last=drop_last, even_batches=even_batches)
        loader.load_state_dict(state)
        length = len(loader)
        batches = [batch.tolist() for batch in loader]
        assert length == 3 + len(batches)  # the epoch's batches, the 3 before the resume included
        counts.append(len(batches))
        consumed += [item for batch in batches for item in batch]
    total = Counter(before + consumed)
    if drop_last:
        assert counts == [12, 12, 12] and set(total.values()) == {1} and len(total) == 178 - 10
    else:
        assert counts == [13, 13, 13] and set(total) == set(all_items())
        assert sum(total.values()) - len(total) == 2  # 10 items over 3 ranks: 2 padding items repeat


def test_states_move_between_in_order_false_and_true_when_that_is_exact(urls):
    stream = make_stream(urls)
    in_order, state = job(stream, 2, 1, None, 4, in_order=True)
    rest, unordered_state = job(stream, 3, 1, state, 3)  # in_order=True -> False, mid-epoch
    last, _ = job(stream, 1, 0, unordered_state, None)
    assert sorted(in_order + rest + last) == all_items()
    with pytest.raises(ResumeStateError, match="^" + re.escape(
            "loader state was saved with in_order=False after batches of a ShardedStream were handed on out of the "
            "in-order sequence, whose rest an in_order=True loader cannot continue: resume this epoch with "
            "in_order=False (in_order=True can take over at the next epoch)") + "$"):
        job(stream, 3, 1, unordered_state, None, in_order=True)
    # One canonical stream, one rank, no workers: in_order=False consumes an in-order prefix.
    single = make_stream(urls, canonical_streams=1)
    head, state = job(single, 1, 0, None, 6)
    tail, _ = job(single, 2, 1, state, None, in_order=True)
    whole, _ = job(single, 1, 0, None, None, in_order=True)
    assert head + sorted(tail) == whole[:24] + sorted(whole[24:])


def test_a_plain_iterable_dataset_resumes_exactly_at_its_num_workers():
    gate = multiprocessing.Event()
    loader = ResumableDataLoader(WorkerSplit(40, {0}, gate), batch_size=4, num_workers=2, in_order=False)
    iterator = iter(loader)
    before = [next(iterator).tolist() for _ in range(2)]  # worker 0 waits at item 0: worker 1's come first
    state = loader.state_dict()
    gate.set()
    del iterator
    assert before == [[1, 3, 5, 7], [9, 11, 13, 15]]
    resumed = ResumableDataLoader(WorkerSplit(40), batch_size=4, num_workers=2, in_order=False)
    resumed.load_state_dict(state)
    after = [item for batch in resumed for item in batch.tolist()]
    assert sorted(sum(before, []) + after) == list(range(40))
    other = ResumableDataLoader(WorkerSplit(40), batch_size=4, num_workers=1, in_order=False)
    with pytest.raises(ResumeStateError, match="an IterableDataset other than ShardedStream resumes only with the "
                                               "saved world size and num_workers$"):
        other.load_state_dict(state)


def test_the_state_stays_small(urls):
    loader = loader_of(make_stream(urls), num_workers=4)
    list(itertools.islice(loader, 5))
    stream_state = loader.state_dict()["rank_0"]["stream"]
    assert sum(value.numel() * 8 for value in stream_state.values()) <= 4096


def test_a_damaged_state_is_refused_naming_the_field(urls):
    stream = make_stream(urls)
    _, state = job(stream, 1, 2, None, 3)
    entry = state["rank_0"]["stream"]
    runs_key = "runs__load_with_dist_resume_load_checkpoint"
    good_runs, good_counts = entry[runs_key].clone(), entry["unordered"].clone()
    entry[runs_key] = good_runs.flip(0)
    with pytest.raises(ResumeStateError, match=re.escape(f"field {runs_key!r} is not ascending runs of an epoch of "
                                                         "178 items")):
        loader_of(stream, num_workers=2).load_state_dict(state)
    entry[runs_key], entry["unordered"] = good_runs, good_counts.clone()
    entry["unordered"][2] = 99
    with pytest.raises(ResumeStateError, match="field 'unordered' says role 0 consumed 99 batches of its 23$"):
        loader_of(stream, num_workers=2).load_state_dict(state)
