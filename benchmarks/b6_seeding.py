"""B6: cost of exact per-sample randomness (G4): the same ResumableDataLoader with
deterministic_transforms on (the default) and off."""

from __future__ import annotations

from dist_resume import ResumableDataLoader

from .report import FigureResult
from .timing import interleaved, repetitions
from .workloads import WORKLOAD_NOTES, epoch_rate, workloads

ON, OFF = "deterministic_transforms=True", "deterministic_transforms=False"
# Targets of issue 12: a few percent where the dataset draws, nothing measurable where it does not.
_COST = {"tiny": 0.01, "token-slice": 0.01, "augmented": 0.03}


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B6", "per-sample randomness on vs off, batches/s (higher is better)", "batches/s",
                          log_scale=True)
    for workload, (dataset, batch_size) in workloads(1 if quick else 4).items():
        for workers in (0, 2):
            case = f"{workload}, {workers} workers"
            loaders = {
                label: ResumableDataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                           seed=0, deterministic_transforms=deterministic)
                for label, deterministic in ((ON, True), (OFF, False))
            }
            runs = {label: (lambda loader=loader: epoch_rate(loader)) for label, loader in loaders.items()}
            stats = interleaved(runs, repetitions(quick, workers))
            for label, value in stats.items():
                result.add(case, label, value)
            cost = stats[OFF].median / stats[ON].median - 1
            result.check(f"{case}: extra time per epoch", cost, f"<= {_COST[workload]}", cost <= _COST[workload])
    result.notes += WORKLOAD_NOTES
    result.notes.append(
        "On: each batch is fetched between snapshots of the torch, random and numpy generators; a "
        "generator the dataset drew from is seeded before every sample from (seed, epoch, position) "
        "from then on (augmented: torch), and the batch that drew is fetched again seeded.")
    return [result]
