"""What skipping the next global batches of an epoch passes over: O(1) arithmetic on the
layout and the elastic plan (O(world size) to name the positions after a resize), no sample
read. Skipped batches are consumed batches for the epoch's accounting (G2), so the elastic
plan of a later resume leaves them out like any consumed ones."""

from __future__ import annotations

from dataclasses import dataclass

from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.layout import Layout


@dataclass(frozen=True)
class SkipSpan:
    """Global batches `[first_step, first_step + steps)` of a layout: what they hold in the
    epoch's positions, and what one rank's share of them is."""

    first_step: int
    steps: int  # global batches skipped, fewer than asked when the epoch ends first
    rank_batches: int  # this rank's batches among them (a rank may lack the final one)
    rank_slots: int  # the slots of those batches, padding included: its consumed samples
    first_position: int  # lowest position among them (all ranks)
    stop_position: int  # one past the highest
    positions: int  # positions among them, padding excluded


def skip_span(plan: Plan, layout: Layout, rank: int, first_step: int, steps: int) -> SkipSpan:
    """Skipping `steps` global batches of `layout` (over `plan`'s stream) from `first_step`,
    the first batch rank `rank` has not consumed; stops at the epoch's end."""
    # Rank 0 serves every global batch of the epoch, the final partial one included.
    steps = max(0, min(steps, layout.num_batches(0) - first_step))
    rank_batches = max(0, min(first_step + steps, layout.num_batches(rank)) - first_step)
    rank_slots = layout.slots_before(rank, first_step + rank_batches) - layout.slots_before(rank, first_step)
    start = min(first_step * layout.global_batch, plan.length)
    stop = min((first_step + steps) * layout.global_batch, plan.length)
    runs = plan.runs(start, stop)
    first_position = min((first for first, _ in runs), default=0)
    stop_position = max((first + count for first, count in runs), default=0)
    return SkipSpan(first_step, steps, rank_batches, rank_slots, first_position, stop_position, stop - start)
