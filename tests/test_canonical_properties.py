"""Property tests of the canonical-stream arithmetic (dist_resume.streams.canonical and the
shard runs of dist_resume.streams.sharded): every item once whatever the steps, global
batches that do not depend on the world size (G3), even ends (G2), one reader per stream
when the world size divides C and C divides G, and the saved position round-trips."""

from __future__ import annotations

import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from dist_resume.positions.layout import TailMode
from dist_resume.streams.canonical import StepLayout, owner, step_chunks, stream_lengths, window
from dist_resume.streams.sharded import stream_spans
from dist_resume.streams.stream_state import CANONICAL, CanonicalPosition, read_position

totals = st.integers(0, 200)
canonical = st.integers(1, 9)
modes = st.sampled_from(list(TailMode))


def items(pieces, padding: bool | None = None) -> list[tuple[int, int]]:
    return [(piece.stream, piece.start + i) for piece in pieces for i in range(piece.count)
            if padding is None or piece.padding == padding]


def epoch_items(lengths) -> list[tuple[int, int]]:
    return sorted((c, i) for c, length in enumerate(lengths) for i in range(length))


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), canonical, st.integers(0, 30))
def test_the_streams_read_every_shard_item_once_in_equal_runs(shard_lengths, streams, seed):
    order = torch.randperm(len(shard_lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    lengths = stream_lengths(sum(shard_lengths), streams)
    assert max(lengths) - min(lengths) <= 1
    read = []
    for stream in range(streams):
        spans = stream_spans(order, shard_lengths, streams, stream)
        assert sum(end - first for _, first, end in spans) == lengths[stream]
        read += [(shard, i) for shard, first, end in spans for i in range(first, end)]
    assert sorted(read) == sorted((shard, i) for shard, length in enumerate(shard_lengths) for i in range(length))
    empty = [shard for shard, length in enumerate(shard_lengths) if length == 0]
    placed = [shard for stream in range(streams) for shard, _, _ in stream_spans(order, shard_lengths, streams, stream)
              if shard_lengths[shard] == 0]
    assert sorted(placed) == sorted(empty)  # every empty shard is opened once, to check it is empty


@given(totals, canonical, st.lists(st.integers(1, 40), min_size=1, max_size=12))
def test_steps_of_any_sizes_take_every_item_once_and_pad_only_past_the_end(total, streams, sizes):
    lengths = stream_lengths(total, streams)
    taken, start = [], 0
    for size in sizes * (total + 1):
        if start >= total:
            break
        layout = step_chunks(lengths, start, size)
        assert [piece.offset for piece in layout] == [sum(p.count for p in layout[:i]) for i in range(len(layout))]
        assert sum(piece.count for piece in layout) == size
        assert len(items(layout, padding=True)) == max(0, start + size - total)
        taken += items(layout, padding=False)
        start += size
    assert sorted(taken) == epoch_items(lengths)


def global_batches(lengths, world_size, batch_size, mode, origin=0) -> list[list[tuple[int, int]]]:
    layout = StepLayout(lengths, origin, world_size, batch_size, mode)
    counts = [layout.num_batches(rank) for rank in range(world_size)]
    return [[item for rank in range(world_size) if step < counts[rank] for item in items(layout.batch(rank, step))]
            for step in range(max(counts, default=0))]


@given(totals, canonical, st.sampled_from([(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]), modes)
def test_g3_global_batches_do_not_depend_on_the_world_size(total, streams, layout, mode):
    lengths = stream_lengths(total, streams)
    assert global_batches(lengths, *layout, mode) == global_batches(lengths, 1, 12, mode)


@given(totals, canonical, st.integers(1, 4), st.integers(1, 5), modes)
def test_g2_ends_are_even_and_every_item_comes_once(total, streams, world_size, batch_size, mode):
    lengths = stream_lengths(total, streams)
    layout = StepLayout(lengths, 0, world_size, batch_size, mode)
    counts = [layout.num_batches(rank) for rank in range(world_size)]
    flat = [item for step in global_batches(lengths, world_size, batch_size, mode) for item in step]
    global_batch = world_size * batch_size
    if mode is TailMode.UNEVEN:
        assert max(counts, default=0) - min(counts, default=0) <= 1
        assert sorted(flat) == epoch_items(lengths)
    elif mode is TailMode.DROP:
        assert len(set(counts)) == 1 and len(flat) == total // global_batch * global_batch == len(set(flat))
    else:
        assert len(set(counts)) == 1 and len(flat) == -(-total // global_batch) * global_batch
        assert sorted(set(flat)) == epoch_items(lengths)  # every item, the padding repeating some


@given(totals, canonical, st.integers(1, 4), st.integers(1, 5), st.integers(0, 60), modes)
def test_a_rank_batch_is_its_window_of_the_step_at_its_position(total, streams, world_size, batch_size, origin, mode):
    """The rule itself, step by step (StepLayout lays out a full step once per rank and
    `start % C`, and shifts it): rank `r`'s batch `j` is `[r*b, (r+1)*b)` of the step at
    `origin + j*G`, its padding kept only when the final step is padded."""
    lengths, origin = stream_lengths(total, streams), min(origin, total)
    layout, global_batch = StepLayout(lengths, origin, world_size, batch_size, mode), world_size * batch_size
    for rank in range(world_size):
        for step in range(layout.num_batches(rank)):
            expected = window(step_chunks(lengths, origin + step * global_batch, global_batch), rank * batch_size,
                              (rank + 1) * batch_size)
            batch = layout.batch(rank, step)
            if mode is TailMode.PAD:
                assert batch == expected
            else:
                assert items(batch) == items(expected, padding=False)
                assert [piece.offset for piece in batch] == [sum(p.count for p in batch[:i]) for i in range(len(batch))]


@given(totals, canonical, st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(0, 40))
def test_g2_a_resume_at_another_global_batch_continues_the_epoch(total, streams, world_size, batch_size,
                                                                 new_batch_size, stop):
    lengths = stream_lengths(total, streams)
    before = StepLayout(lengths, 0, world_size, batch_size, TailMode.UNEVEN)
    stop = min(stop, before.num_batches(world_size - 1))
    origin = before.end(stop - 1) if stop else 0
    first = global_batches(lengths, world_size, batch_size, TailMode.UNEVEN)[:stop]
    rest = global_batches(lengths, 2, new_batch_size, TailMode.UNEVEN, origin)
    assert sorted(item for step in first + rest for item in step) == epoch_items(lengths)


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), totals, modes)
def test_one_reader_per_stream_when_the_world_size_divides_c_and_c_divides_g(world_size, per_rank, per_stream,
                                                                             workers, total, mode):
    """With world size | C | G, each stream's items, padding included, go to one rank
    alone, read by one of its workers: no stream is read twice (an epoch of fewer items
    than streams pads its empty streams from the others: then a stream may be read twice)."""
    streams = world_size * per_rank
    assume(total >= streams)
    layout = StepLayout(stream_lengths(total, streams), 0, world_size, streams * per_stream // world_size, mode)
    readers: dict[int, set[tuple[int, int]]] = {}
    for rank in range(world_size):
        for step in range(layout.num_batches(rank)):
            for piece in layout.batch(rank, step):
                readers.setdefault(piece.stream, set()).add((rank, owner(piece.stream, workers)))
    assert all(len(who) == 1 for who in readers.values())


@given(st.integers(1, 2**20), st.integers(1, 2**40), st.integers(0, 2**62), st.integers(-2**63, 2**63 - 1),
       st.integers(0, 2**32))
def test_the_saved_position_round_trips(canonical_streams, global_batch, position, lengths_digest, reader_digest):
    saved = CanonicalPosition(canonical_streams, global_batch, position, lengths_digest, reader_digest)
    entry = {CANONICAL: torch.tensor(saved, dtype=torch.int64)}
    assert read_position(entry, "here") == saved
