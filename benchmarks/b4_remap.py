"""B4: time and peak memory of `plan_resume` for a job of N ranks resuming at M ranks."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

from dist_resume import plan_resume
from tests.remap_helpers import fresh_states, job_states

from .report import FigureResult
from .timing import Stats, interleaved, seconds

LENGTH = 10**10
BATCH = 32
TARGET = (4096, 3072)
QUICK_PAIRS = [(8, 6), (512, 384), TARGET, (4096, 8192), (16384, 12288)]
FULL_PAIRS = QUICK_PAIRS + [(32768, 24576), (100_000, 75_000), (75_000, 100_000)]


def stopped_job(world_size: int) -> dict[str, Any]:
    """The merged states of `world_size` ranks that stopped unevenly mid-epoch: each rank
    0 to 15 batches behind the leader (every lag is a distinct level of the plan)."""
    job = plan_resume(fresh_states(LENGTH, world_size, BATCH, drop_last=False, even_batches=True), world_size)
    steps = job.layout.num_batches(0) // 2
    lags = random.Random(world_size)
    consumed = [steps - lags.randrange(16) for _ in range(world_size)]
    return job_states(job, consumed, drop_last=False, even_batches=True)


def peak_bytes(states: dict[str, Any], world_size: int) -> int:
    tracemalloc.start()
    try:
        plan_resume(states, world_size)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def run(quick: bool) -> list[FigureResult]:
    setting = f"{LENGTH:.0e} samples, batch {BATCH} per rank"
    result = FigureResult("B4", f"plan_resume time, N -> M ranks, {setting}", "s", log_scale=True)
    memory = FigureResult("B4-memory", f"plan_resume peak memory (tracemalloc), N -> M ranks, {setting}", "bytes",
                          log_scale=True)
    pairs = QUICK_PAIRS if quick else FULL_PAIRS
    jobs = {old: stopped_job(old) for old in sorted({old for old, _ in pairs})}
    stats = interleaved({f"{old} -> {new}": (lambda old=old, new=new: seconds(lambda: plan_resume(jobs[old], new)))
                         for old, new in pairs}, reps=3 if quick else 5)
    for old, new in pairs:
        case = f"{old} -> {new}"
        result.add(case, "plan time", stats[case])
        memory.add(case, "peak memory", Stats.exact(peak_bytes(jobs[old], new)))
    target = stats[f"{TARGET[0]} -> {TARGET[1]}"].median
    result.check(f"{TARGET[0]} -> {TARGET[1]} ranks, seconds", target, "< 0.1", target < 0.1)
    result.notes.append("Ranks stopped 0-15 batches apart, half-way through the epoch; the input is the merged "
                        "state dict of every old rank (decoding it is part of the time).")
    memory.notes.append("Measured in a separate, untimed call (tracemalloc slows Python down).")
    return [result, memory]
