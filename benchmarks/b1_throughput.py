"""B1: batches/s over an epoch, ResumableDataLoader vs torch's DataLoader vs torchdata's StatefulDataLoader."""

from __future__ import annotations

from .report import FigureResult
from .timing import interleaved
from .workloads import LOADERS, OURS, TORCH, TORCHDATA, AugmentedDataset, TinyDataset, epoch_rate


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B1", "batches/s over one shuffled epoch (higher is better)", "batches/s", log_scale=True)
    scale = 1 if quick else 4
    # Long enough that worker start (num_workers=2, once per epoch) does not dominate.
    workloads = {
        "tiny": (TinyDataset(32_768 * scale), 64),
        "augmented": (AugmentedDataset(4_096 * scale), 32),
    }
    reps = 3 if quick else 7
    for workload, (dataset, batch_size) in workloads.items():
        for workers in (0, 2):
            case = f"{workload}, {workers} workers"
            loaders = {name: make(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)
                       for name, make in LOADERS.items()}
            runs = {name: (lambda loader=loader: epoch_rate(loader)) for name, loader in loaders.items()}
            stats = interleaved(runs, reps)
            for name, value in stats.items():
                result.add(case, name, value)
            for other, target in ((TORCH, 0.97), (TORCHDATA, 1.0)):
                ratio = stats[OURS].median / stats[other].median
                result.check(f"{case}: vs {other}", ratio, f">= {target}", ratio >= target)
    result.notes += [
        f"tiny: sample i is the int i ({len(workloads['tiny'][0]):,} samples, batch 64): pure loader overhead.",
        f"augmented: random crop 144->128, flip, normalize of a 3x144x144 uint8 image "
        f"({len(workloads['augmented'][0]):,} samples, batch 32).",
        "Each epoch is timed from iter() (worker start included) to the last batch; every loader "
        "at its defaults besides batch_size, shuffle=True, num_workers; ResumableDataLoader with "
        "deterministic_transforms on (its default, see B6).",
    ]
    return [result]
