"""B1: batches/s over an epoch, ResumableDataLoader vs torch's DataLoader vs torchdata's StatefulDataLoader."""

from __future__ import annotations

from .report import FigureResult
from .timing import interleaved, repetitions
from .workloads import LOADERS, OURS, TORCH, TORCHDATA, WORKLOAD_NOTES, epoch_rate, workloads

# Targets of issue 12: near torch where per-batch work is real, within 10% on pure overhead.
_VS_TORCH = {"tiny": 0.90, "token-slice": 0.97, "augmented": 0.97}


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B1", "batches/s over one shuffled epoch (higher is better)", "batches/s", log_scale=True)
    sizes = workloads(1 if quick else 4)
    for workload, (dataset, batch_size) in sizes.items():
        for workers in (0, 2):
            case = f"{workload}, {workers} workers"
            loaders = {name: make(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)
                       for name, make in LOADERS.items()}
            runs = {name: (lambda loader=loader: epoch_rate(loader)) for name, loader in loaders.items()}
            stats = interleaved(runs, repetitions(quick, workers))
            for name, value in stats.items():
                result.add(case, name, value)
            for other, target in ((TORCH, _VS_TORCH[workload]), (TORCHDATA, 1.0)):
                ratio = stats[OURS].median / stats[other].median
                result.check(f"{case}: vs {other}", ratio, f">= {target}", ratio >= target)
    result.notes += [f"{note} {len(sizes[note.split(':')[0]][0]):,} samples." for note in WORKLOAD_NOTES]
    result.notes.append(
        "Each epoch is timed from iter() (worker start included) to the last batch; every loader "
        "at its defaults besides batch_size, shuffle=True, num_workers; ResumableDataLoader with "
        "deterministic_transforms on (its default, see B6).")
    return [result]
