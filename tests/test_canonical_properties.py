"""Property tests of the canonical-stream arithmetic (dist_resume.streams.canonical): the
epoch order takes every item of every stream once; global batches do not depend on the
world size (G3); ends are even (G2); ownership and the extra-reading bound; the saved
position round-trips."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.positions.layout import TailMode
from dist_resume.streams.canonical import EpochOrder, StepLayout, owner
from dist_resume.streams.stream_state import CANONICAL, CanonicalPosition, read_position

lengths = st.lists(st.integers(0, 30), min_size=1, max_size=9)
modes = st.sampled_from(list(TailMode))


def items(pieces) -> list[tuple[int, int]]:
    return [(piece.stream, piece.start + i) for piece in pieces for i in range(piece.count)]


def epoch_items(stream_lengths) -> list[tuple[int, int]]:
    return sorted((c, i) for c, length in enumerate(stream_lengths) for i in range(length))


@given(lengths, st.lists(st.integers(0, 300), max_size=6))
def test_the_epoch_order_takes_every_item_once_whatever_the_cuts(stream_lengths, cuts):
    order = EpochOrder(stream_lengths)
    bounds = sorted({0, order.total, *(cut % (order.total + 1) for cut in cuts)})
    taken = []
    for start, stop in zip(bounds, bounds[1:]):
        pieces = order.chunks(start, stop)
        assert sum(piece.count for piece in pieces) == stop - start
        assert [piece.stream for piece in pieces] == sorted({piece.stream for piece in pieces})
        assert [piece.offset for piece in pieces] == [sum(p.count for p in pieces[:i]) for i in range(len(pieces))]
        taken += items(pieces)
    assert sorted(taken) == epoch_items(stream_lengths)
    assert len(order.phases) <= len(stream_lengths)


@given(lengths, st.integers(1, 12))
def test_streams_advance_round_by_round(stream_lengths, cut):
    """After any position, the streams with items left have given the same number of items
    (within one): the order never runs ahead on one stream."""
    order = EpochOrder(stream_lengths)
    cut = min(cut, order.total)
    given = {c: 0 for c in range(len(stream_lengths))}
    for piece in order.chunks(0, cut):
        given[piece.stream] = piece.count
    running = [given[c] for c, length in enumerate(stream_lengths) if length > given[c]]
    assert max(running, default=0) - min(running, default=0) <= 1


def global_batches(order, world_size, batch_size, mode, origin=0) -> list[list[tuple[int, int]]]:
    layout = StepLayout(order, origin, world_size, batch_size, mode)
    counts = [layout.num_batches(rank) for rank in range(world_size)]
    return [[item for rank in range(world_size) if step < counts[rank] for item in items(layout.batch(rank, step))]
            for step in range(max(counts, default=0))]


@given(lengths, st.sampled_from([(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]), modes)
def test_g3_global_batches_do_not_depend_on_the_world_size(stream_lengths, layout, mode):
    order = EpochOrder(stream_lengths)
    assert global_batches(order, *layout, mode) == global_batches(order, 1, 12, mode)


@given(lengths, st.integers(1, 4), st.integers(1, 5), modes)
def test_g2_ends_are_even_and_every_item_comes_once(stream_lengths, world_size, batch_size, mode):
    order = EpochOrder(stream_lengths)
    layout = StepLayout(order, 0, world_size, batch_size, mode)
    counts = [layout.num_batches(rank) for rank in range(world_size)]
    steps = global_batches(order, world_size, batch_size, mode)
    flat = [item for step in steps for item in step]
    full, partial = divmod(order.total, world_size * batch_size)
    if mode is TailMode.UNEVEN:
        assert max(counts) - min(counts) <= 1
        assert sorted(flat) == epoch_items(stream_lengths)
        return
    assert len(set(counts)) == 1
    if mode is TailMode.DROP:
        assert len(flat) == full * world_size * batch_size and len(set(flat)) == len(flat)
    else:
        assert sorted(flat[:order.total]) == epoch_items(stream_lengths)
        padding = flat[order.total:]
        assert len(padding) == (-order.total) % (world_size * batch_size)
        wrapped, left = [], len(padding)  # the epoch's first positions, wrapped as often as needed
        while left:
            wrapped += items(order.chunks(0, min(left, order.total)))
            left -= min(left, order.total)
        assert padding == wrapped


@given(lengths, st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.integers(0, 40))
def test_g2_a_resume_at_another_global_batch_continues_the_epoch_order(stream_lengths, world_size, batch_size,
                                                                        new_batch_size, stop):
    """Steps from a position reached at one global batch, continued at another: the items
    are the epoch order's, each once."""
    order = EpochOrder(stream_lengths)
    before = StepLayout(order, 0, world_size, batch_size, TailMode.UNEVEN)
    stop = min(stop, before.num_batches(world_size - 1))
    origin = before.end(stop - 1) if stop else 0
    first = global_batches(order, world_size, batch_size, TailMode.UNEVEN)[:stop]
    rest = global_batches(order, 2, new_batch_size, TailMode.UNEVEN, origin)
    assert sorted(item for step in first + rest for item in step) == epoch_items(stream_lengths)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(1, 3),
       st.lists(st.integers(5, 9), min_size=1, max_size=4))
@settings(max_examples=60)
def test_one_reader_per_stream_when_the_world_size_divides_c_and_c_divides_g(world_size, per_rank, per_stream,
                                                                             workers, shard_lengths):
    """With world size | C | G, while every stream has items, each stream's items go to one
    rank alone, read by one of its workers: no stream is read twice."""
    streams = world_size * per_rank
    order = EpochOrder([sum(shard_lengths)] * streams)
    layout = StepLayout(order, 0, world_size, streams * per_stream // world_size, TailMode.DROP)
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
