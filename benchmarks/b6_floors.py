"""B6-floor: where B6's cost of exact per-sample randomness goes at num_workers=0. The fetch
of one batch (the inner loader's dataset and collate, in this process) is timed three ways,
batch by batch in rotated order: unseeded and unwatched, each sample reseeded by hand
(what G4 cannot do without), and ResumableDataLoader's fetch; plus its fixed costs alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dist_resume import ResumableDataLoader
from dist_resume.randomness.global_generators import NAMES, generators, joint_snapshot
from dist_resume.randomness.seeds import derive_seeds

from .report import FigureResult
from .timing import Stats, rotated, seconds
from .workloads import workloads

UNSEEDED = "fetch + collate, unseeded and unwatched"
BY_HAND = "fetch + collate, torch reseeded by hand before each sample"
OURS = "fetch + collate by ResumableDataLoader (deterministic_transforms=True)"
WATCH = "alone: two snapshots of the torch, random and numpy states + their comparison"
SEED = "alone: torch.default_generator.manual_seed"


def _per_call(fn: Callable[[], object], calls: int, reps: int) -> Stats:
    """Seconds per call of `fn`, over `reps` timings of `calls` calls."""
    def loop() -> None:
        for _ in range(calls):
            fn()

    return Stats.of([seconds(loop) / calls for _ in range(reps)])


def _fetchers(dataset: Any, batch_size: int) -> tuple[list[Any], dict[str, Callable[[Any], Any]]]:
    """The batch requests of one epoch, and each way of fetching one."""
    loaders = [ResumableDataLoader(dataset, batch_size=batch_size, shuffle=True, seed=0,
                                   deterministic_transforms=deterministic) for deterministic in (True, False)]
    for loader in loaders:
        sum(1 for _ in loader)  # the probe has learnt what the dataset draws from
    ours, plain = (loader._inner_loader() for loader in loaders)
    requests = list(ours.batch_sampler)
    collate, reseed = ours.collate_fn, torch.default_generator.manual_seed

    def by_hand(request: Any) -> Any:
        samples = []
        for seed, index in zip(derive_seeds(0, request.epoch, request.positions), request.indices):
            reseed(seed)
            samples.append(dataset[index])
        return collate(samples)

    fetchers = {
        UNSEEDED: lambda request: collate(plain.dataset.__getitems__(request)),
        OURS: lambda request: collate(ours.dataset.__getitems__(request)),
    }
    if ours.dataset._randomness.seeded:
        fetchers[BY_HAND] = by_hand
    return requests, fetchers


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B6-floor", "where B6's cost goes at 0 workers: one batch's fetch, in process (lower is better)",
                          "s")
    reps = 2 if quick else 6
    saved = torch.default_generator.get_state()
    try:
        snapshot, _ = joint_snapshot(generators(NAMES))
        before = snapshot()
        result.add("fixed costs", WATCH, _per_call(lambda: (snapshot(), snapshot() != before), 10_000, 5))
        result.add("fixed costs", SEED, _per_call(lambda: torch.default_generator.manual_seed(12345), 10_000, 5))
        for workload, (dataset, batch_size) in workloads(1).items():
            requests, fetchers = _fetchers(dataset, batch_size)
            times: dict[str, list[float]] = {name: [] for name in fetchers}
            names = list(fetchers)
            for rep in range(reps):
                for request in requests:
                    for name in rotated(names, rep):
                        times[name].append(seconds(lambda: fetchers[name](request)))
            stats = {name: Stats.of(values) for name, values in times.items()}
            for name, value in stats.items():
                result.add(workload, name, value)
            base = stats[UNSEEDED].median
            parts = [f"ours +{stats[OURS].median / base - 1:.1%}"]
            if BY_HAND in stats:
                parts.append(f"reseeding by hand alone +{stats[BY_HAND].median / base - 1:.1%}")
            result.notes.append(f"{workload} (batch {batch_size}), per batch vs unseeded: {', '.join(parts)}.")
    finally:
        torch.default_generator.set_state(saved)
    result.notes += [
        "Only augmented draws (from torch): it is reseeded before every sample; the others are only watched.",
        "The watch compares each generator's whole state (3 x 624 words): a draw of a multiple of 624 words "
        "leaves the index where it was, so only the whole state tells a draw from none exactly.",
        "After a batch that streams megabytes (augmented), the watch and the restore of the caller's state "
        "read the generators' memory back from DRAM: several times their cost alone.",
    ]
    return [result]
