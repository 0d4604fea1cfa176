"""ShardedStream through ResumableDataLoader, in process: the global batches are those of an
uninterrupted run at every world size and num_workers (G3), ends are even (G2), the state is
a few integers (G5), and bad inputs fail with one clear error naming the field or the
shard (G6, G9), the last state staying loadable."""

from __future__ import annotations

import itertools
import os
import re
from typing import Any

import pytest
import torch

from dist_resume import ResumableDataLoader, ResumeStateError
from dist_resume.errors import StorageError
from dist_resume import ShardCountError
from dist_resume.streams import ShardedStream

from .s3_server import FAKE_SECRET, s3_bucket, s3_endpoint  # noqa: F401
from .stream_jobs import SHARD_SIZES, all_items, make_stream, read_jsonl, write_shards

GLOBAL_BATCH = 6


@pytest.fixture
def urls(tmp_path) -> list[str]:
    return write_shards(str(tmp_path))


def job(stream: ShardedStream, world_size: int, num_workers: int, state: dict[str, Any] | None,
        steps: int | None, **options: Any) -> tuple[list[list[list[int]]], dict[str, Any]]:
    """Each rank's batches (global batch 6) and the merged state of all ranks; a job that
    runs to the epoch's end checks that len(loader) counted the epoch's batches, those of
    earlier jobs included."""
    per_rank, merged = [], {}
    for rank in range(world_size):
        loader = ResumableDataLoader(stream, batch_size=GLOBAL_BATCH // world_size, num_workers=num_workers,
                                     rank=rank, world_size=world_size, **options)
        if state is not None:
            loader.load_state_dict(state)
        length = len(loader)
        per_rank.append([batch.tolist() for batch in itertools.islice(loader, steps)])
        if steps is None:
            assert length == (int(state[f"rank_{rank}"]["progress"][12]) if state and f"rank_{rank}" in state
                              and int(state[f"rank_{rank}"]["progress"][8]) == world_size else
                              max((int(entry["progress"][12]) for key, entry in (state or {}).items()
                                   if key.startswith("rank_")), default=0)) + len(per_rank[-1])
        merged.update(loader.state_dict())
    return per_rank, merged


def global_steps(per_rank: list[list[list[int]]]) -> list[list[int]]:
    assert len({len(batches) for batches in per_rank}) == 1, "ranks got different numbers of batches"
    return [[item for batches in per_rank for item in batches[step]] for step in range(len(per_rank[0]))]


@pytest.mark.parametrize("chain", [[(2, 2, 3), (3, 0, 2), (1, 2, None)], [(3, 1, 1), (2, 0, 4), (6, 1, None)],
                                   [(2, 0, 2), (2, 2, 3), (2, 1, None)]],
                         ids=["2x2-3x0-1x2", "3x1-2x0-6x1", "2x0-2x2-2x1"])
@pytest.mark.parametrize("options", [{}, {"drop_last": True}], ids=["padded", "dropped"])
def test_g3_global_batches_are_the_uninterrupted_runs(urls, chain, options):
    stream = make_stream(urls)  # canonical_streams: the first job's slots, adopted after
    slots = chain[0][0] * max(chain[0][1], 1)
    state, steps = None, []
    for world_size, num_workers, stop in chain:
        per_rank, state = job(stream, world_size, num_workers, state, stop, **options)
        steps += global_steps(per_rank)
    expected, _ = job(make_stream(urls, canonical_streams=slots), 1, 0, None, None, **options)
    assert steps == expected[0]
    total = len(all_items())
    items = [item for step in steps for item in step]
    if options:
        assert len(items) == total // GLOBAL_BATCH * GLOBAL_BATCH and len(set(items)) == len(items)
    else:  # the final step is padded with items from the start of the epoch
        assert len(items) == -(-total // GLOBAL_BATCH) * GLOBAL_BATCH and sorted(set(items)) == all_items()
        assert len(items) - len(set(items)) == -total % GLOBAL_BATCH


def test_without_even_batches_ranks_without_items_in_the_final_step_get_one_batch_less(urls):
    per_rank, _ = job(make_stream(urls, canonical_streams=4), 3, 0, None, None, even_batches=False)
    full, partial = divmod(len(all_items()), GLOBAL_BATCH)
    assert partial and full + 1 == max(len(batches) for batches in per_rank)
    assert min(len(batches) for batches in per_rank) >= full
    assert sum(len(batches[-1]) for batches in per_rank if len(batches) > full) == partial
    assert sorted(item for batches in per_rank for batch in batches for item in batch) == all_items()


def test_the_next_epoch_is_another_order_of_every_item(urls):
    stream = make_stream(urls, canonical_streams=2)
    loader = ResumableDataLoader(stream, batch_size=5, even_batches=False)
    epochs = [[item for batch in loader for item in batch.tolist()] for _ in range(2)]
    assert [sorted(epoch) for epoch in epochs] == [all_items()] * 2 and epochs[0] != epochs[1]


def test_g5_state_is_a_few_integers_at_ten_thousand_shards():
    stream = ShardedStream([f"shard-{i}.jsonl" for i in range(10_000)], read_jsonl, lengths=[3] * 10_000)
    entry = ResumableDataLoader(stream, batch_size=4, rank=1, world_size=8).state_dict()["rank_1"]
    sizes = [value.numel() * value.element_size() for value in entry.values() if isinstance(value, torch.Tensor)]
    sizes += [value.numel() * value.element_size() for value in entry["stream"].values()]
    assert sum(sizes) <= 4096


def test_a_reader_count_is_used_and_checked(urls):
    class Counted:
        def __call__(self, file):
            return read_jsonl(file)

        def count(self, file) -> int:
            return sum(1 for _ in file) + (file.path.endswith("shard-03.jsonl"))  # one too many for shard 3

    stream = ShardedStream(urls, Counted(), window=8, seed=11)
    message = (f"shard {urls[3]} holds 97 items, fewer than its count of 98: the shard changed since it was "
               "counted, or lengths= is wrong")
    with pytest.raises(ShardCountError, match=f"^{re.escape(message)}$"):
        list(ResumableDataLoader(stream, batch_size=4))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_shard_longer_than_its_length_is_an_error(urls, num_workers):
    lengths = list(SHARD_SIZES)
    lengths[0] -= 1
    loader = ResumableDataLoader(make_stream(urls, lengths=lengths), batch_size=4, num_workers=num_workers)
    message = (f"shard {urls[0]} holds more than its count of 39 items: the shard changed since it was counted, "
               "or lengths= is wrong")
    with pytest.raises(ShardCountError, match=re.escape(message)):
        list(loader)


@pytest.mark.parametrize("lengths", [None, SHARD_SIZES], ids=["counting", "reading"])
def test_a_missing_shard_fails_with_its_url_and_the_last_state_stays_loadable(urls, lengths):
    """Counted at load (no lengths=) or read by a worker: the job fails naming the shard
    and the cause; once the shard is back, the state taken before resumes exactly."""
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(make_stream(urls, lengths=lengths, canonical_streams=2), batch_size=4,
                                   num_workers=1 if lengths else 0)

    expected = [batch.tolist() for batch in loader()]
    head = loader()
    next(iter(head))
    state = head.state_dict()
    os.rename(urls[3], urls[3] + ".away")
    failing = loader()
    with pytest.raises(StorageError, match=rf"cannot read shard {re.escape(urls[3])}: not found \(FileNotFoundError"):
        failing.load_state_dict(state)
        list(failing)
    os.rename(urls[3] + ".away", urls[3])
    resumed = loader()
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == expected[1:]


def test_an_s3_error_names_the_shard_and_no_secret(s3_bucket):
    urls = write_shards(f"{s3_bucket}/shards")
    stream = make_stream(urls + [f"{s3_bucket}/shards/absent.jsonl"])
    with pytest.raises(StorageError) as raised:
        list(ResumableDataLoader(stream, batch_size=4))
    assert str(raised.value).startswith(f"cannot read shard {s3_bucket}/shards/absent.jsonl: not found")
    assert FAKE_SECRET not in str(raised.value)


def test_a_state_with_other_canonical_streams_is_refused(urls):
    loader = ResumableDataLoader(make_stream(urls, canonical_streams=4), batch_size=4)
    next(iter(loader))
    message = ("loader state entry 'rank_0' stream field 'canonical' was saved with canonical_streams=4; this "
               "ShardedStream has canonical_streams=3")
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        ResumableDataLoader(make_stream(urls, canonical_streams=3), batch_size=4).load_state_dict(loader.state_dict())


def test_a_state_from_ranks_at_different_positions_resumes_only_at_its_world_size(urls):
    stream = make_stream(urls)
    state: dict[str, Any] = {}
    for rank, steps in enumerate([2, 1]):
        loader = ResumableDataLoader(stream, batch_size=3, rank=rank, world_size=2)
        list(itertools.islice(loader, steps))
        state.update(loader.state_dict())
    mixed = ("loader state entries come from different saves (ranks [0] at batch 2 of epoch 0; ranks [1] at batch 1 "
             "of epoch 0): a rank stopped between a training step and the save, or states of different saves were "
             "merged; resume from a checkpoint that every rank saved at one step (if the ranks do not train in "
             "lockstep, load with independent_ranks=True)")
    with pytest.raises(ResumeStateError, match=f"^{re.escape(mixed)}$"):
        ResumableDataLoader(stream, batch_size=2, world_size=3, rank=0).load_state_dict(state)
    message = ("saved ranks stopped at different epoch positions of a ShardedStream (rank 0 at 12, rank 1 at 6); a "
               "resume at another world size or global batch continues from a position every rank reached: save "
               "every rank after the same number of batches, or resume at world size 2 with global batch 6")
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        ResumableDataLoader(stream, batch_size=2, world_size=3, rank=0).load_state_dict(state, independent_ranks=True)
    resumed = ResumableDataLoader(stream, batch_size=3, world_size=2, rank=1)
    resumed.load_state_dict(state, independent_ranks=True)  # each rank continues from its own position
    total = len(resumed)  # the epoch's batches, the one rank 1 consumed included
    assert len(list(resumed)) == total - 1


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(canonical_streams=0), ValueError, "canonical_streams must be in [1, 1048577), got 0"),
    (dict(lengths=[1]), ValueError, "lengths must hold one item count per shard (2)"),
    (dict(lengths=[1, -1]), ValueError, "lengths[1] must be in [0, 2**63), got -1"),
])
def test_bad_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        ShardedStream(["a.jsonl", "b.jsonl"], read_jsonl, **kwargs)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_workers_beyond_the_streams_return_empty_parts(urls):
    """3 workers, 2 canonical streams: the third owns none, and the batches are unchanged."""
    def batches(num_workers: int) -> list[list[int]]:
        stream = make_stream(urls, canonical_streams=2)
        return [batch.tolist() for batch in ResumableDataLoader(stream, batch_size=5, num_workers=num_workers)]

    assert batches(3) == batches(0)


def test_a_reader_error_names_the_shard(urls):
    def failing(file):
        for line in file:
            if b"3005" in line:
                raise ValueError("bad line")
            yield 0

    with pytest.raises(ValueError, match="^bad line") as raised:
        list(ResumableDataLoader(ShardedStream(urls, failing, lengths=SHARD_SIZES), batch_size=4))
    assert raised.value.__notes__ == [f"while reading shard {urls[3]}"]
