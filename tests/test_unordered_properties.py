"""The state of in_order=False (the consumed prefix, the batches delivered beyond it) and the
elastic plan of its holes, for any delivery order and any chain of resumes (hypothesis)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_resume import plan_resume
from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.layout import TailMode
from dist_resume.positions.rank_batches import rank_positions
from dist_resume.state.delivered import DELIVERED_KEY, Delivered
from dist_resume.state.fields import rank_key

from .remap_helpers import fresh_states, job_states

MODES = [(True, True), (False, True), (False, False)]  # (drop_last, even_batches)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), total=st.integers(0, 120), in_flight=st.integers(1, 16), first=st.integers(0, 20))
def test_any_delivery_order_keeps_the_state_bounded_and_exact(data, total, in_flight, first):
    """Requests go out in order, at most `in_flight` unanswered (workers x prefetch_factor);
    the answers come back in any order."""
    first = min(first, total)
    delivered = Delivered(first)
    sent, outstanding, handed = first, [], set(range(first))
    while sent < total or outstanding:
        while sent < total and len(outstanding) < in_flight:
            outstanding.append(sent)
            sent += 1
        batch = outstanding.pop(data.draw(st.integers(0, len(outstanding) - 1)))
        delivered.deliver(batch)
        handed.add(batch)
        assert len(delivered.holes) < in_flight  # O(1) in the epoch's length
        assert len(delivered.encode()) * 8 <= 4096
        assert delivered.prefix == min(set(range(total + 1)) - handed)
        pending = list(delivered.pending(total))
        assert sorted(pending) == sorted(set(range(total)) - handed) and len(pending) == len(set(pending))
        if delivered.ahead:
            key = rank_key(0)
            again = Delivered.decode(delivered.encode(), key, delivered.prefix)
            assert (again.frontier, again.holes) == (delivered.frontier, delivered.holes)


def test_a_batch_delivered_twice_is_an_error():
    delivered = Delivered()
    delivered.deliver(1)
    delivered.deliver(0)
    try:
        delivered.deliver(0)
    except RuntimeError as error:
        assert str(error) == "batch 0 of this epoch was delivered twice"
    else:
        raise AssertionError("delivered twice without an error")


def _out_of_order_stop(data, job, number, in_flight):
    """Per rank of `job`: the batches it delivered (absolute in its layout) when stopped
    with up to `in_flight` batches unanswered, and its state's delivered entry."""
    delivered_batches, entries = [], {}
    for rank in range(job.layout.world_size):
        first, total = job.consumed[rank], job.layout.num_batches(rank)
        frontier = data.draw(st.integers(first, total), label=f"job {number} rank {rank} frontier")
        below = list(range(first, max(first, frontier - 1)))
        holes = sorted(data.draw(st.lists(st.sampled_from(below), unique=True, max_size=in_flight - 1), label="holes")
                       if below else [])
        delivered_batches.append([b for b in range(first, frontier) if b not in holes])
        if holes:
            entries[rank] = Delivered(frontier, holes)
    return delivered_batches, entries


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), length=st.integers(0, 300), mode=st.sampled_from(MODES),
       jobs=st.lists(st.tuples(st.integers(1, 8), st.integers(1, 7)), min_size=1, max_size=4),
       in_flight=st.integers(1, 8))
def test_every_position_exactly_once_across_out_of_order_resumes(data, length, mode, jobs, in_flight):
    drop_last, even_batches = mode
    world_size, batch_size = jobs[0]
    states = fresh_states(length, world_size, batch_size, drop_last=drop_last, even_batches=even_batches)
    real: list[int] = []
    for number, (world_size, batch_size) in enumerate(jobs):
        job = plan_resume(states, world_size, batch_size)
        # The plan holds every pending level and its holes until a later job trains them (three
        # integers each): fewer than `in_flight` per rank of that level's job, whatever the length.
        levels = job.plan.levels
        assert all(len(level.holes) <= level.world_size * (in_flight - 1) for level in levels)
        holes = sum(len(level.holes) for level in levels)
        assert len(job.plan.encode()) == (2 + sum(3 + level.world_size for level in levels)
                                          + (1 + 3 * holes if holes else 0) if levels else 0)
        if number == len(jobs) - 1:
            delivered = [list(range(job.consumed[r], job.layout.num_batches(r))) for r in range(world_size)]
            entries = {}
        else:
            delivered, entries = _out_of_order_stop(data, job, number, in_flight)
        for rank, batches in enumerate(delivered):
            for batch in batches:
                positions = _positions(job, rank, batch)
                real += positions
        prefixes = [entries[r].prefix if r in entries else job.consumed[r] + len(delivered[r]) for r in range(world_size)]
        states = job_states(job, prefixes, drop_last=drop_last, even_batches=even_batches)
        for rank, entry in entries.items():
            states[rank_key(rank)][DELIVERED_KEY] = entry.encode()
    assert len(real) == len(set(real)), "a position was consumed twice"
    missing = set(range(length)) - set(real)
    if drop_last:
        # Only the final partial global batch of the last job's stream is dropped.
        assert len(missing) == job.plan.length % job.layout.global_batch
    else:
        assert not missing


def _positions(job, rank: int, batch: int) -> list[int]:
    """The real positions (padding left out) of batch `batch` of `rank` in `job`."""
    positions, _ = rank_positions(job.plan, job.layout, rank, batch, batch + 1)
    padding = job.layout.batch(rank, batch).padding
    values = positions.tolist()
    return values[: len(values) - padding]


def test_the_holes_survive_the_plan_encoding():
    states = fresh_states(40, 2, 4, drop_last=False, even_batches=True)
    job = plan_resume(states, 2, 4)
    states = job_states(job, [0, 1], drop_last=False, even_batches=True)
    states[rank_key(0)][DELIVERED_KEY] = torch.tensor([3, 0, 1], dtype=torch.int64)  # batch 2 delivered
    resumed = plan_resume(states, 3, 2)
    assert resumed.plan.encode() == [0, 1, 0, 2, 4, 3, 1, 2, 0, 0, 0, 0, 0, 1]
    first = [batch.positions for rank in range(3) for batch in list(resumed.batches(rank))[:1]]
    assert first == [[0, 1], [2, 3], [8, 9]]  # rank 0's holes (batches 0, 1), then the catch-up


@pytest.mark.parametrize(
    "values, message",
    [
        ([0, 1, 0, 2, 4, 3, 1, 1, 0, 1], "elastic plan's holes are truncated"),
        ([0, 1, 0, 2, 4, 3, 1, 0], "elastic plan's holes are truncated"),
        ([0, 1, 0, 2, 4, 3, 1, 1, 1, 0, 0], "elastic plan has a hole in level 1 of 1"),
        ([0, 1, 0, 2, 4, 3, 1, 1, 0, 1, 1], "hole (rank 1, batch 1) is not a batch its rank passed"),
        ([0, 1, 0, 2, 4, 3, 1, 2, 0, 0, 1, 0, 0, 0], "holes [(0, 1), (0, 0)] are not in global-step order"),
        ([0, 1, 8, 0, 0, 1, 0, 0, 0], "hole (rank 0, batch 0) is not a batch its rank passed"),
    ],
)
def test_a_damaged_plan_of_holes_is_refused(values, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Plan.decode(values, 40, TailMode.PAD, 0)
