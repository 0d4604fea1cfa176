"""B9: batches/s with stragglers, in_order=False vs in_order=True (issue 22)."""

from __future__ import annotations

import time

from torch.utils.data import DataLoader, Dataset

from dist_resume import ResumableDataLoader

from .report import FigureResult
from .timing import interleaved
from .workloads import epoch_rate

UNORDERED, ORDERED = "ResumableDataLoader in_order=False", "ResumableDataLoader in_order=True"
TORCH_UNORDERED, TORCH_ORDERED = "torch DataLoader in_order=False", "torch DataLoader in_order=True"
_WORKERS, _BATCH, _EVERY, _DELAY = 4, 4, 16, 0.04


class StragglerDataset(Dataset):
    """Sample i is the int i; one sample in 16 (shuffled over the epoch) takes 40 ms: a large
    image, a remote read."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index % _EVERY == _EVERY - 1:
            time.sleep(_DELAY)
        return index


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B9", "batches/s with stragglers, out-of-order delivery (higher is better)", "batches/s")
    dataset = StragglerDataset(512 if quick else 1024)
    shared = dict(batch_size=_BATCH, shuffle=True, num_workers=_WORKERS)
    loaders = {
        UNORDERED: ResumableDataLoader(dataset, seed=0, in_order=False, **shared),
        ORDERED: ResumableDataLoader(dataset, seed=0, **shared),
        TORCH_UNORDERED: DataLoader(dataset, in_order=False, **shared),
        TORCH_ORDERED: DataLoader(dataset, **shared),
    }
    case = f"1 sample in {_EVERY} takes {_DELAY * 1000:.0f} ms, {_WORKERS} workers, batch {_BATCH}"
    stats = interleaved({name: (lambda loader=loader: epoch_rate(loader)) for name, loader in loaders.items()},
                        3 if quick else 9)
    for name, value in stats.items():
        result.add(case, name, value)
    for other, target in ((ORDERED, 1.3), (TORCH_UNORDERED, 0.9)):
        ratio = stats[UNORDERED].median / stats[other].median
        result.check(f"{UNORDERED} vs {other}", ratio, f">= {target}", ratio >= target)
    result.notes.append(
        f"{len(dataset):,} samples, shuffled; each epoch timed from iter() (worker start included) to the "
        "last batch; the four loaders interleaved in one run. With in_order=False a resume trains every "
        "sample of the epoch exactly once, in another order than an uninterrupted run (docs/slow-steps.md).")
    return [result]
