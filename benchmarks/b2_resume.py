"""B2: time to the first batch after resuming part-way through a 10,000,000-sample shuffled epoch."""

from __future__ import annotations

import copy
import itertools
import time
from typing import Any

from torch.utils.data import DataLoader

from dist_resume.state.fields import FIELDS, PROGRESS_KEY, rank_key

from .report import FigureResult
from .timing import interleaved, seconds
from .workloads import LOADERS, OURS, TORCH, TORCHDATA, TinyDataset

LENGTH = 10_000_000
BATCH = 64
POSITIONS = (0.0, 0.5, 0.99)


def make(name: str, dataset: TinyDataset) -> DataLoader:
    """A new loader of the epoch measured here (a resumed job starts in a new process)."""
    return LOADERS[name](dataset, batch_size=BATCH, shuffle=True)


def ours_state_at(dataset: TinyDataset, batches: int) -> dict[str, Any]:
    """The state a ResumableDataLoader saves after `batches` batches of epoch 0, without
    iterating them: its state counts batches and samples, nothing else moves."""
    state = make(OURS, dataset).state_dict()
    progress = state[rank_key(0)][PROGRESS_KEY]
    progress[FIELDS.index("batches_consumed")] = batches
    progress[FIELDS.index("samples_consumed")] = batches * BATCH
    return state


def torchdata_state_at(dataset: TinyDataset, batches: int) -> dict[str, Any]:
    """The state a StatefulDataLoader (num_workers=0) saves after `batches` batches: its
    counters of batches and sampler draws, next to the generator state of the epoch."""
    loader = make(TORCHDATA, dataset)
    next(iter(loader))
    state = copy.deepcopy(loader.state_dict())
    state["_sampler_iter_state"]["samples_yielded"] = batches * BATCH
    state["_sampler_iter_state"]["sampler_iter_state"]["yielded"] = batches * BATCH
    state["_sampler_iter_yielded"] = state["_num_yielded"] = batches
    return state


def first_batch(loader: DataLoader, state: dict[str, Any] | None = None) -> float:
    """Seconds from load_state_dict (if any) to the first batch of the next iter()."""
    def resume() -> None:
        if state is not None:
            loader.load_state_dict(state)
        next(iter(loader))
    return seconds(resume)


def naive_skip(dataset: TinyDataset, batches: int, cap: float) -> tuple[float, bool]:
    """Seconds to skip `batches` batches of a plain DataLoader by iterating them, then take
    one; stops at `cap` seconds and returns (elapsed, True) as a lower bound."""
    start = time.perf_counter()
    iterator = iter(make(TORCH, dataset))
    for _ in itertools.islice(iterator, batches):
        if time.perf_counter() - start > cap:
            return time.perf_counter() - start, True
    next(iterator)
    return time.perf_counter() - start, False


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult(
        "B2", f"time to first batch, {LENGTH:,}-sample shuffled epoch, batch {BATCH} (lower is better)", "s",
        log_scale=True)
    dataset = TinyDataset(LENGTH)
    # Ours takes milliseconds: many repetitions of its own cases keep the ratio to fresh
    # out of the noise. The others take seconds (torchdata replays its sampler up to the
    # position): fewer repetitions, and none to warm up in quick runs.
    ours_reps, reps, warmup, cap = (10, 2, 0, 2.0) if quick else (30, 5, 1, 60.0)
    total = LENGTH // BATCH + (LENGTH % BATCH > 0)
    ours = {("fresh", OURS): lambda: first_batch(make(OURS, dataset))}
    others = {("fresh", name): (lambda name=name: first_batch(make(name, dataset))) for name in (TORCHDATA, TORCH)}
    lower_bounds: dict[str, bool] = {}
    for fraction in POSITIONS:
        batches = int(fraction * total)
        case = f"resume at {fraction:.0%}"
        ours[(case, OURS)] = lambda state=ours_state_at(dataset, batches): first_batch(make(OURS, dataset), state)
        others[(case, TORCHDATA)] = lambda state=torchdata_state_at(dataset, batches): first_batch(
            make(TORCHDATA, dataset), state)

        def skip(batches: int = batches, case: str = case) -> float:
            elapsed, capped = naive_skip(dataset, batches, cap)
            lower_bounds[case] = lower_bounds.get(case, False) or capped
            return elapsed

        others[(case, "naive skip (DataLoader + islice)")] = skip
    for cases, count, skipped in ((ours, ours_reps, 1), (others, reps, warmup)):
        for (case, series), stats in interleaved(cases, count, skipped).items():
            result.add(case, series, stats)
    fresh = result.value("fresh", OURS).median
    for fraction in POSITIONS:
        case = f"resume at {fraction:.0%}"
        ratio = result.value(case, OURS).median / fresh
        result.check(f"{case}: vs fresh epoch", ratio, "<= 1.1", ratio <= 1.1)
        if lower_bounds.get(case):
            result.notes.append(f"naive skip, {case}: stopped after {cap:.0f} s: a lower bound.")
    result.notes += [
        "Each measurement builds a new loader (as a resumed job does) and times load_state_dict + "
        "iter() + the first batch; num_workers=0, sample i is the int i.",
        "The states at 50% and 99% are built from a real state_dict() by setting its consumed counters "
        "(what iterating that far would leave), for both ResumableDataLoader and torchdata.",
        "naive skip fetches and collates every skipped batch; with real samples it is slower still.",
    ]
    return [result]
