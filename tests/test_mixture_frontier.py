"""`Plan.frontier`, where a re-weighted Mixture's new stage starts: past every position
consumed by the earlier jobs of the epoch and by the current stream's first slots, with
every position from it on still to be served (hypothesis, over chains of elastic resumes)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.rank_batches import rank_positions
from dist_resume.positions.layout import Layout, TailMode


def _consumed(plan: Plan, layout: Layout, counts: list[int]) -> set[int]:
    positions = set()
    for rank, count in enumerate(counts):
        for index in range(count):
            batch, _ = rank_positions(plan, layout, rank, index, index + 1)
            real = len(batch) - layout.batch(rank, index).padding
            positions.update(batch[:real].tolist())
    return positions


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(1, 200), st.sampled_from(list(TailMode)),
       st.lists(st.tuples(st.integers(1, 5), st.integers(1, 7)), min_size=0, max_size=3))
def test_frontier_is_past_the_consumed_and_before_the_unserved(data, length: int, mode: TailMode, jobs) -> None:
    plan = Plan(length, mode, 0)
    consumed: set[int] = set()
    for world_size, batch_size in jobs:
        layout = Layout(plan.length, world_size, batch_size, mode)
        counts = [data.draw(st.integers(0, layout.num_batches(rank))) for rank in range(world_size)]
        consumed |= _consumed(plan, layout, counts)
        plan = plan.after(layout, counts)
    image = [p for first, count in plan.runs(0, plan.length) for p in range(first, first + count)]
    assert not consumed & set(image)
    slots = data.draw(st.integers(0, plan.length))
    frontier = plan.frontier(slots)
    assert all(position < frontier for position in consumed | set(image[:slots]))
    assert set(range(frontier, length)) <= set(image[slots:])
    assert plan.frontier(plan.length) == length
