"""The arithmetic of a ShardedStream pass with in_order=False (streams/unordered_pass): for
any rest of an epoch, layout and counts of batches each worker role handed on, the
consumed items and the leftover runs are the rest, each item once (G2); every rank gets
the same number of batches, full but for its final one; in-order rests convert exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.positions.layout import TailMode
from dist_resume.streams.canonical import stream_lengths
from dist_resume.streams.unordered_pass import (UnorderedPass, in_order_position, merged_runs, remaining_after,
                                                runs_length)


def items(runs) -> list[int]:
    return [position for start, stop in runs for position in range(start, stop)]


@st.composite
def passes(draw):
    total = draw(st.integers(1, 60))
    cuts = sorted(draw(st.lists(st.integers(0, total), max_size=8)))
    bounds = [0, *cuts, total]
    runs = merged_runs(zip(bounds[::2], bounds[1::2]))  # every other piece: a rest with holes
    served = UnorderedPass(runs, total, draw(st.integers(1, 4)), draw(st.integers(1, 5)),
                           draw(st.sampled_from(list(TailMode))), draw(st.integers(1, 3)))
    counts = {rank: [draw(st.integers(0, len(served.role_batches(rank, role)))) for role in range(served.roles)]
              for rank in range(served.layout.world_size)}
    return served, counts


@settings(max_examples=150, deadline=None)
@given(passes())
def test_consumed_and_leftover_items_are_the_rest_each_once(case):
    served, counts = case
    consumed, sizes = [], {}
    for rank, rank_counts in counts.items():
        sizes[rank] = [len(items(served.batch(rank, index)[0])) + len(served.batch(rank, index)[1])
                       for index in range(served.num_batches(rank))]
        groups = [served.role_batches(rank, role) for role in range(served.roles)]
        assert [index for group in groups for index in group] == list(range(served.num_batches(rank)))
        for group, count in zip(groups, rank_counts):
            consumed += [position for index in group[:count] for position in items(served.batch(rank, index)[0])]
    leftover = items(served.leftover(counts))
    assert sorted(consumed + leftover) == items(served.runs)
    full = {len(sizes[rank]) for rank in sizes}
    if served.layout.mode is not TailMode.UNEVEN:
        assert len(full) == 1  # every rank gets the same number of batches
    assert all(size == served.layout.batch_size for rank in sizes for size in sizes[rank][:-1])
    if all(count == len(served.role_batches(rank, role)) for rank, rank_counts in counts.items()
           for role, count in enumerate(rank_counts)):
        # Everything served: what is left is what the final step's mode drops.
        dropped = len(leftover)
        assert dropped == (runs_length(served.runs) % served.layout.global_batch
                           if served.layout.mode is TailMode.DROP else 0)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 80), st.integers(1, 9), st.data())
def test_an_in_order_rest_converts_both_ways(total, streams, data):
    lengths = stream_lengths(total, streams)
    position = data.draw(st.integers(0, total))
    rest = remaining_after(position, lengths)
    assert runs_length(rest) == total - position
    assert in_order_position(rest, lengths) == position
    begin = [sum(lengths[:stream]) for stream in range(streams)]
    consumed = {begin[m % streams] + m // streams for m in range(position)}
    assert set(items(rest)) == set(range(total)) - consumed


@settings(max_examples=150, deadline=None)
@given(passes(), st.data())
def test_a_skip_from_a_common_prefix_passes_over_exactly_its_batches(case, data):
    """Every rank consumed its first `done` batches, then skipped the next `steps`: its
    `rank_positions` are those batches' items, and the counts that put each role past them
    leave the rest of the runs, each item once."""
    served, _ = case
    world_size = served.layout.world_size
    done = data.draw(st.integers(0, served.num_batches(0)))
    steps = data.draw(st.integers(0, served.num_batches(0) - done))
    consumed, skipped, counts = [], [], {}
    for rank in range(world_size):
        stop = min(done + steps, served.num_batches(rank))
        first = min(done, stop)
        for start, end, into in [(0, first, consumed), (first, stop, skipped)]:
            from_batches = [position for index in range(start, end) for position in items(served.batch(rank, index)[0])]
            assert items(served.rank_positions(rank, start, end)) == from_batches
            into += from_batches
        counts[rank] = [min(max(stop - group.start, 0), len(group))
                        for group in (served.role_batches(rank, role) for role in range(served.roles))]
    assert sorted(consumed + skipped + items(served.leftover(counts))) == items(served.runs)
