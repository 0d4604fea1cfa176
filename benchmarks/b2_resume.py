"""B2: time to the first batch after resuming part-way through a 10,000,000-sample shuffled epoch."""

from __future__ import annotations

import copy
import itertools
import time
from typing import Any

from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from dist_resume import ResumableDataLoader
from dist_resume.state import FIELDS, PROGRESS_KEY, rank_key

from .report import FigureResult
from .timing import Stats, interleaved, seconds
from .workloads import TinyDataset

LENGTH = 10_000_000
BATCH = 64
POSITIONS = (0.0, 0.5, 0.99)


def ours_state_at(dataset: TinyDataset, batches: int) -> dict[str, Any]:
    """The state a ResumableDataLoader saves after `batches` batches of epoch 0, without
    iterating them: its state counts batches and samples, nothing else moves."""
    state = ResumableDataLoader(dataset, batch_size=BATCH, shuffle=True, seed=0).state_dict()
    progress = state[rank_key(0)][PROGRESS_KEY]
    progress[FIELDS.index("batches_consumed")] = batches
    progress[FIELDS.index("samples_consumed")] = batches * BATCH
    return state


def torchdata_state_at(dataset: TinyDataset, batches: int) -> dict[str, Any]:
    """The state a StatefulDataLoader (num_workers=0) saves after `batches` batches: its
    counters of batches and sampler draws, next to the generator state of the epoch."""
    loader = StatefulDataLoader(dataset, batch_size=BATCH, shuffle=True)
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
    iterator = iter(DataLoader(dataset, batch_size=BATCH, shuffle=True))
    for _ in itertools.islice(iterator, batches):
        if time.perf_counter() - start > cap:
            return time.perf_counter() - start, True
    next(iterator)
    return time.perf_counter() - start, False


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B2", f"time to first batch, {LENGTH:,}-sample shuffled epoch, batch {BATCH} (lower is better)",
                          "s", log_scale=True)
    dataset = TinyDataset(LENGTH)
    # torchdata replays the sampler up to the position (seconds at 99%): quick runs skip the
    # warm-up repetition, after one warm call of ours (imports, first allocations).
    reps, warmup, cap = (2, 0, 2.0) if quick else (5, 1, 60.0)
    total = LENGTH // BATCH + (LENGTH % BATCH > 0)
    # Fresh loaders each time: a resumed job starts in a new process.
    cases = {
        ("fresh", "ResumableDataLoader"): lambda: first_batch(ResumableDataLoader(dataset, batch_size=BATCH, shuffle=True, seed=0)),
        ("fresh", "torchdata StatefulDataLoader"): lambda: first_batch(StatefulDataLoader(dataset, batch_size=BATCH, shuffle=True)),
        ("fresh", "torch DataLoader"): lambda: first_batch(DataLoader(dataset, batch_size=BATCH, shuffle=True)),
    }
    lower_bounds: dict[str, bool] = {}
    for fraction in POSITIONS:
        batches = int(fraction * total)
        case = f"resume at {fraction:.0%}"
        ours, theirs = ours_state_at(dataset, batches), torchdata_state_at(dataset, batches)
        cases[(case, "ResumableDataLoader")] = lambda state=ours: first_batch(
            ResumableDataLoader(dataset, batch_size=BATCH, shuffle=True, seed=0), state)
        cases[(case, "torchdata StatefulDataLoader")] = lambda state=theirs: first_batch(
            StatefulDataLoader(dataset, batch_size=BATCH, shuffle=True), state)

        def skip(batches: int = batches, case: str = case) -> float:
            elapsed, capped = naive_skip(dataset, batches, cap)
            lower_bounds[case] = lower_bounds.get(case, False) or capped
            return elapsed

        cases[(case, "naive skip (DataLoader + islice)")] = skip
    cases[("fresh", "ResumableDataLoader")]()
    stats = interleaved({f"{case}|{series}": fn for (case, series), fn in cases.items()}, reps, warmup)
    for key, value in stats.items():
        case, series = key.split("|")
        result.add(case, series, value)
    fresh = result.value("fresh", "ResumableDataLoader").median
    for fraction in POSITIONS:
        case = f"resume at {fraction:.0%}"
        ratio = result.value(case, "ResumableDataLoader").median / fresh
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
