"""Property tests of a Mixture of streams' step arithmetic (dist_resume.mixtures.stream_steps):
a loader epoch's items, cut into steps anywhere, are exactly those its positions draw one by
one; each step is laid out canonical stream by canonical stream, each followed by an equal
run of the map-style draws; and the global batches do not depend on the world size (G3)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import Mixture
from dist_resume.mixtures.stream_steps import MixtureLayout, SourceKey
from dist_resume.positions.layout import TailMode
from dist_resume.streams import ShardedStream

from .stream_mixture_jobs import Table

shard_lengths = st.lists(st.integers(0, 9), min_size=1, max_size=6).filter(lambda lengths: sum(lengths) > 0)
mixtures = st.fixed_dictionaries({
    "streams": st.lists(shard_lengths, min_size=1, max_size=3),
    "with_map": st.booleans(),
    "quotas": st.lists(st.lists(st.integers(0, 4), min_size=4, max_size=4), min_size=1, max_size=2),
    "second_stage": st.integers(1, 150),
    "length": st.integers(1, 120),
    "canonical_streams": st.integers(1, 5),
    "epoch": st.integers(0, 2),
})


def build(spec) -> tuple[Mixture, list[ShardedStream]]:
    """The mixture `spec` describes (stream sources `s0, s1, ...`, then the map-style one)
    and its stream sources (shard names only: `lengths` spares reading them)."""
    streams = [ShardedStream([f"memory://s{i}/{j}" for j in range(len(lengths))], read_nothing, lengths=lengths,
                             seed=i) for i, lengths in enumerate(spec["streams"])]
    sources: dict = {f"s{i}": stream for i, stream in enumerate(streams)}
    if spec["with_map"]:
        sources["table"] = Table()
    stages = []
    for index, quotas in enumerate(spec["quotas"]):
        weights = dict(zip(sources, quotas))
        if sum(weights.values()) == 0:
            weights["s0"] = 1
        stages.append((index * spec["second_stage"], weights))
    return Mixture(sources, stages, spec["length"], canonical_streams=spec["canonical_streams"]), streams


def read_nothing(file):
    return iter(())


def items(pieces) -> list[tuple]:
    """(source, source-epoch, canonical stream, index) of each item; a map-style draw:
    (source, -1, 0, draw), wherever it was laid out."""
    return [(key.source, key.epoch, key.stream if key.epoch >= 0 else 0, piece.start + i)
            for piece in pieces for key in [piece.stream] for i in range(piece.count)]


def one_by_one(mixture: Mixture, streams: list[ShardedStream], spec) -> list[tuple]:
    """Each position's item, drawn alone: (source, source-epoch, canonical stream, index)
    for a stream source (position `m` of a source-epoch is item `m // C` of canonical
    stream `m % C`), (source, -1, 0, draw) for the map-style one."""
    drawn = []
    start = spec["epoch"] * mixture.length
    for position in range(start, start + mixture.length):
        before, after = mixture.schedule.draws_before(position), mixture.schedule.draws_before(position + 1)
        (source,) = [s for s in range(len(before)) if after[s] > before[s]]
        draw = before[source]
        if source == len(streams):
            drawn.append((source, -1, 0, draw))
            continue
        epoch, within = divmod(draw, mixture.lengths[source])
        stream, index = within % spec["canonical_streams"], within // spec["canonical_streams"]
        drawn.append((source, epoch, stream, index))
    return drawn


@settings(max_examples=150, deadline=None)
@given(mixtures, st.lists(st.integers(0, 200), max_size=6))
def test_steps_cut_anywhere_hold_the_positions_items_laid_out_stream_first(spec, cuts):
    mixture, streams = build(spec)
    order = mixture.step_source(0, False).step_order(spec["epoch"], spec["canonical_streams"])
    assert order.total == mixture.length
    bounds = sorted({0, order.total, *(cut % (order.total + 1) for cut in cuts)})
    taken = []
    for start, stop in zip(bounds, bounds[1:]):
        pieces = order.chunks(start, stop)
        assert sum(piece.count for piece in pieces) == stop - start
        assert [piece.offset for piece in pieces] == [sum(p.count for p in pieces[:i]) for i in range(len(pieces))]
        keys = [piece.stream for piece in pieces]
        assert all(isinstance(key, SourceKey) for key in keys)
        assert keys == sorted(keys, key=lambda k: (k.stream, k.epoch < 0, k.source, k.epoch))
        runs = [sum(piece.count for piece in pieces if piece.stream.epoch < 0 and piece.stream.stream == c)
                for c in range(spec["canonical_streams"])]
        mapped = sum(runs)
        assert runs == [(c + 1) * mapped // len(runs) - c * mapped // len(runs) for c in range(len(runs))]
        taken += items(pieces)
    assert sorted(taken) == sorted(one_by_one(mixture, streams, spec))


@settings(max_examples=80, deadline=None)
@given(mixtures, st.integers(1, 4), st.integers(1, 4), st.integers(1, 5), st.sampled_from(list(TailMode)))
def test_global_batches_do_not_depend_on_the_world_size(spec, world_size, other, batch_size, mode):
    mixture, _ = build(spec)
    order = mixture.step_source(0, False).step_order(spec["epoch"], spec["canonical_streams"])
    global_batch = world_size * other * batch_size

    def steps(ranks: int) -> list[list[tuple]]:
        layout = MixtureLayout(order, 0, ranks, global_batch // ranks, mode)
        counts = [layout.num_batches(rank) for rank in range(ranks)]
        return [[item for rank in range(ranks) if step < counts[rank] for item in items(layout.batch(rank, step))]
                for step in range(max(counts))]

    assert steps(world_size) == steps(other) == steps(1)


def test_a_later_source_epoch_retires_only_the_same_streams_earlier_readers():
    later = SourceKey(1, 3, 2)
    assert later.supersedes(SourceKey(1, 2, 2)) and later.supersedes(SourceKey(1, 0, 2))
    assert not any(later.supersedes(key) for key in (SourceKey(1, 3, 2), SourceKey(1, 4, 2), SourceKey(0, 2, 2),
                                                     SourceKey(1, 2, 1), SourceKey(1, -1, 0), 2))
