"""B6: cost of deterministic per-sample seeding (G4): the same ResumableDataLoader with it on and off."""

from __future__ import annotations

from dist_resume import ResumableDataLoader

from .report import FigureResult
from .timing import interleaved
from .workloads import AugmentedDataset, TinyDataset, epoch_rate

ON, OFF = "deterministic_transforms=True", "deterministic_transforms=False"


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B6", "per-sample seeding on vs off, batches/s (higher is better)", "batches/s",
                          log_scale=True)
    scale = 1 if quick else 4
    workloads = {
        "tiny": (TinyDataset(16_384 * scale), 64),
        "augmented": (AugmentedDataset(4_096 * scale), 32),
    }
    reps = 3 if quick else 7
    for workload, (dataset, batch_size) in workloads.items():
        for workers in (0, 2):
            case = f"{workload}, {workers} workers"
            loaders = {
                label: ResumableDataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                                           seed=0, deterministic_transforms=deterministic)
                for label, deterministic in ((ON, True), (OFF, False))
            }
            runs = {label: (lambda loader=loader: epoch_rate(loader)) for label, loader in loaders.items()}
            stats = interleaved(runs, reps)
            for label, value in stats.items():
                result.add(case, label, value)
            cost = stats[OFF].median / stats[ON].median - 1
            result.check(f"{case}: extra time per epoch", cost, "<= 0.05", cost <= 0.05)
    result.notes.append("Seeding sets torch's CPU generator, `random` and numpy's global generator before "
                        "every sample, from (seed, epoch, position); its cost per sample is fixed, so it "
                        "weighs most on tiny samples.")
    return [result]
