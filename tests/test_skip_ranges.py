"""Arithmetic of skipping: the recorded ranges (bounded, oldest merged, counts kept) and the
positions a skip passes over, against a brute-force walk of every rank's batches (G2)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.rank_batches import rank_positions
from dist_resume.positions.layout import Layout, TailMode
from dist_resume.positions.skip_span import skip_span
from dist_resume.state.skips import MAX_SKIPPED_RANGES, SkipLedger, SkippedRange


@st.composite
def ranges(draw) -> list[SkippedRange]:
    """Exact single-epoch ranges in increasing order, some adjacent to the one before."""
    found, epoch, batch, position = [], 0, 0, 0
    for _ in range(draw(st.integers(0, 3 * MAX_SKIPPED_RANGES))):
        if draw(st.booleans()):
            epoch, batch, position = epoch + draw(st.integers(0, 1)), batch + draw(st.integers(1, 5)), position + 7
        batches = draw(st.integers(1, 4))
        found.append(SkippedRange(epoch, batch, position, epoch, batch + batches, position + 3 * batches,
                                  batches, 3 * batches))
        batch, position = batch + batches, position + 3 * batches
    return found


def _key(epoch: int, number: int) -> tuple[int, int]:
    return epoch, number


@settings(max_examples=300, deadline=None)
@given(ranges())
def test_the_ledger_stays_bounded_and_loses_no_skipped_batch(added: list[SkippedRange]) -> None:
    ledger = SkipLedger()
    for skipped in added:
        ledger = ledger.adding(skipped)
    kept = ledger.ranges
    assert len(kept) <= MAX_SKIPPED_RANGES
    assert sum(r.batches for r in kept) == sum(r.batches for r in added)
    assert sum(r.positions for r in kept) == sum(r.positions for r in added)
    for skipped in added:  # every skipped range lies inside exactly one recorded span
        holders = [r for r in kept if _key(r.first_epoch, r.first_batch) <= _key(skipped.first_epoch, skipped.first_batch)
                   and _key(skipped.last_epoch, skipped.stop_batch) <= _key(r.last_epoch, r.stop_batch)
                   and _key(r.first_epoch, r.first_position) <= _key(skipped.first_epoch, skipped.first_position)
                   and _key(skipped.last_epoch, skipped.stop_position) <= _key(r.last_epoch, r.stop_position)]
        assert len(holders) == 1
    # Only the oldest are merged: the newest ranges, unless adjacent ones joined, are as added.
    joined: list[SkippedRange] = []
    for skipped in added:
        if joined and joined[-1].continued_by(skipped):
            joined[-1] = joined[-1].merged(skipped)
        else:
            joined.append(skipped)
    newest = MAX_SKIPPED_RANGES - 1
    assert kept[-newest:] == tuple(joined[-newest:])
    assert all(r.exact for r in kept) == (len(joined) <= MAX_SKIPPED_RANGES)
    assert SkipLedger.from_tensor(ledger.to_tensor(), "rank_0") == ledger


@st.composite
def skips(draw) -> tuple[Plan, Layout, int, int]:
    mode = draw(st.sampled_from(list(TailMode)))
    length = draw(st.integers(0, 60))
    plan = Plan(length, mode, 0)
    if draw(st.booleans()) and length:  # an earlier job of another layout stopped unevenly
        old = Layout(length, draw(st.integers(1, 4)), draw(st.integers(1, 4)), mode)
        consumed = [draw(st.integers(0, old.num_batches(rank))) for rank in range(old.world_size)]
        plan = plan.after(old, consumed)
    layout = Layout(plan.length, draw(st.integers(1, 4)), draw(st.integers(1, 5)), mode)
    first = draw(st.integers(0, layout.num_batches(0)))
    return plan, layout, first, draw(st.integers(0, 8))


@settings(max_examples=400, deadline=None)
@given(skips())
def test_a_skip_passes_over_exactly_the_positions_of_its_global_batches(case) -> None:
    plan, layout, first, steps = case
    total = layout.num_batches(0)
    skipped = min(steps, total - first)
    positions, slots = set(), 0
    spans = []
    for rank in range(layout.world_size):
        if first > layout.num_batches(rank):
            continue  # this rank finished before `first`: the loader skips nothing of the epoch there
        stop = min(first + skipped, layout.num_batches(rank))
        for index in range(first, stop):  # the positions the loader would have requested
            found, _ = rank_positions(plan, layout, rank, index, index + 1)
            real = found.tolist()[:len(found) - layout.batch(rank, index).padding]
            positions |= set(real)
            slots += len(real)
        span = skip_span(plan, layout, rank, first, steps)
        spans.append(span)
        assert (span.steps, span.rank_batches) == (skipped, stop - first)
        assert span.rank_slots == layout.slots_before(rank, stop) - layout.slots_before(rank, first)
    span = spans[0]  # every rank's span names the same global batches and positions
    assert all((s.steps, s.first_position, s.stop_position, s.positions) ==
               (span.steps, span.first_position, span.stop_position, span.positions) for s in spans)
    assert span.positions == len(positions) == slots
    if positions:
        assert (span.first_position, span.stop_position) == (min(positions), max(positions) + 1)



def test_a_merged_range_says_what_it_spans_and_how_much_of_it_was_skipped() -> None:
    ledger = SkipLedger()
    for epoch in range(MAX_SKIPPED_RANGES + 1):
        ledger = ledger.adding(SkippedRange(epoch, 3, 96, epoch, 5, 160, 2, 64))
    merged, *rest = ledger.ranges
    assert not merged.exact and all(r.exact for r in rest)
    assert str(merged) == ("epoch 0 global batch 3 to epoch 1 global batch 4: 4 of these global batches, and 128 "
                           "positions between epoch 0 position 96 and epoch 1 position 159, were skipped")
    assert str(rest[0]) == "epoch 2: global batches 3 to 4 (2), positions 96 to 159 (64)"
