"""G2 and G3 for the remapping arithmetic, over random chains of resumes (hypothesis)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dist_resume import plan_resume

from .remap_helpers import fresh_states, job_states

MODES = [(True, True), (False, True), (False, False)]  # (drop_last, even_batches)


def _run_chain(data, length, drop_last, even_batches, jobs, lockstep):
    """Runs `jobs` (world size, batch size) one after the other over one epoch, each
    stopped at drawn points, the last one to the end. Returns per job: the plan and the
    batches consumed, in (step, rank) order, as (positions, padding) per batch."""
    world_size, batch_size = jobs[0]
    states = fresh_states(length, world_size, batch_size, drop_last=drop_last, even_batches=even_batches)
    history = []
    for number, (world_size, batch_size) in enumerate(jobs):
        job = plan_resume(states, world_size, batch_size)
        # Same world size and batch size: every rank simply continues its own count.
        available = [job.remaining_batches(rank) for rank in range(world_size)]
        last = number == len(jobs) - 1
        if last:
            more = available
        elif lockstep:
            step = data.draw(st.integers(0, max(available)), label=f"job {number} batches")
            more = [min(step, n) for n in available]
        else:
            more = [data.draw(st.integers(0, n), label=f"job {number} rank {r} batches") for r, n in enumerate(available)]
        per_rank = [list(job.batches(rank))[:count] for rank, count in enumerate(more)]
        steps = max(more, default=0)
        consumed = [per_rank[rank][step] for step in range(steps) for rank in range(world_size) if step < more[rank]]
        history.append((job, consumed))
        totals = [done + count for done, count in zip(job.consumed, more)]
        states = job_states(job, totals, drop_last=drop_last, even_batches=even_batches)
    return history


chain_settings = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
lengths = st.one_of(st.integers(0, 400), st.sampled_from([0, 1, 2, 97, 1009]))
jobs_strategy = st.lists(st.tuples(st.integers(1, 64), st.integers(1, 9)), min_size=1, max_size=4)


@chain_settings
@given(data=st.data(), length=lengths, mode=st.sampled_from(MODES), jobs=jobs_strategy, lockstep=st.booleans())
def test_g2_every_position_exactly_once_across_resumes(data, length, mode, jobs, lockstep):
    drop_last, even_batches = mode
    history = _run_chain(data, length, drop_last, even_batches, jobs, lockstep)
    real = [p for _, batches in history for batch in batches for p in batch.positions[: len(batch.positions) - batch.padding]]
    padding = [p for _, batches in history for batch in batches for p in batch.positions[len(batch.positions) - batch.padding :]]
    assert len(real) == len(set(real)), "a position was consumed twice"
    last_job, _ = history[-1]
    missing = set(range(length)) - set(real)
    if drop_last:
        # G2: only the final partial global batch of the last job's stream is dropped.
        assert len(missing) == last_job.plan.length % last_job.layout.global_batch
        assert not padding
    else:
        assert not missing
    if (drop_last, even_batches) == (False, True):
        counts = {last_job.layout.num_batches(rank) for rank in range(last_job.layout.world_size)}
        assert len(counts) == 1, "even_batches: every rank gets the same number of batches"
        for job, batches in history:
            # Each job pads its final global batch with fewer than world-size slots,
            # taken from the start of the epoch order, wrapping around.
            padded = [p for batch in batches for p in batch.positions[len(batch.positions) - batch.padding :]]
            assert len(padded) < job.layout.world_size
            assert set(padded) <= {i % max(length, 1) for i in range(job.layout.world_size)}
    else:
        assert not padding


@chain_settings
@given(data=st.data(), length=lengths, mode=st.sampled_from(MODES), jobs=jobs_strategy)
def test_g3_lockstep_stops_keep_the_global_order(data, length, mode, jobs):
    """Stops after whole global steps (as checkpoints do): consumed in global-step order,
    the positions are exactly 0, 1, 2, ... whatever the world sizes and batch sizes."""
    drop_last, even_batches = mode
    history = _run_chain(data, length, drop_last, even_batches, jobs, lockstep=True)
    real = [p for _, batches in history for batch in batches for p in batch.positions[: len(batch.positions) - batch.padding]]
    assert real == list(range(len(real)))


@chain_settings
@given(data=st.data(), length=lengths, mode=st.sampled_from(MODES), jobs=jobs_strategy)
def test_g3_uneven_stops_keep_the_previous_jobs_step_order(data, length, mode, jobs):
    """After ranks stopped at different counts, the next job first serves what the
    partly consumed steps left, step by step, then the rest: the previous job's global
    step of every position it serves never decreases."""
    drop_last, even_batches = mode
    history = _run_chain(data, length, drop_last, even_batches, jobs, lockstep=False)
    for (previous, _), (job, batches) in zip(history, history[1:]):
        if (job.layout.world_size, job.layout.batch_size) == (previous.layout.world_size, previous.layout.batch_size):
            continue  # not re-partitioned: each rank continues its own batches
        step_of = {}
        for rank in range(previous.layout.world_size):
            for index, batch in enumerate(previous.batches(rank), start=previous.consumed[rank]):
                real = batch.positions[: len(batch.positions) - batch.padding]
                step_of.update((p, index) for p in real)
        tail = previous.plan.length // previous.layout.global_batch  # positions past the previous layout's steps
        steps = [step_of.get(p, tail) for batch in batches for p in batch.positions[: len(batch.positions) - batch.padding]]
        assert steps == sorted(steps)


@given(
    length=st.integers(10**9, 10**10),
    old=st.one_of(st.integers(1, 300), st.just(4096)),
    new=st.one_of(st.integers(1, 300), st.sampled_from([3072, 100_000])),
    batch_size=st.integers(1, 512),
    steps=st.integers(0, 3),
    lags=st.randoms(use_true_random=False),
)
# The same world size (the README's test run of 2026-11-29 drew it): every rank continues its own count.
@example(length=10**9, old=1, new=1, batch_size=1, steps=1, lags=random.Random(0))
@settings(max_examples=6, deadline=None)
def test_remap_is_independent_of_dataset_length(length, old, new, batch_size, steps, lags):
    """Huge datasets and world sizes: the plan is O(ranks) (it would not fit otherwise),
    and the first batches of the new ranks are disjoint from what was consumed. (Old jobs of
    100,000 ranks are planned in tests/test_cli_damaged.py and benchmark B4: listing every
    position they consumed, as this test does, takes minutes.)"""
    mode = MODES[1]
    states = fresh_states(length, old, batch_size, drop_last=mode[0], even_batches=mode[1])
    job = plan_resume(states, old, batch_size)
    stops = [steps + lags.randrange(2) for _ in range(old)]
    states = job_states(job, stops, drop_last=mode[0], even_batches=mode[1])
    resumed = plan_resume(states, new, batch_size)
    served = [p for rank in sorted({0, new - 1}) for batch in _first(resumed, rank, 2) for p in batch.positions]
    assert all(set(served).isdisjoint(batch.positions)
               for rank, stop in enumerate(stops) for batch in _first(job, rank, stop))
    assert len(served) == len(set(served))
    if new == old:  # the saved plan, each rank at its own count
        assert (resumed.plan.length, resumed.consumed) == (length, tuple(stops))
    else:  # a plan of what is left
        assert (resumed.plan.length, resumed.consumed) == (length - sum(stops) * batch_size, (0,) * new)


def _first(job, rank, count):
    iterator = job.batches(rank)
    return [next(iterator) for _ in range(min(count, job.remaining_batches(rank)))]
