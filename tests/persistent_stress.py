"""The child of tests/test_persistent_stress.py: `ResumableDataLoader`s with persistent
workers, built and re-iterated many times in the patterns of torch's
`test_iterable_style_dataset` and `test_builtin_collection_conversion` (issue 35 point 3),
each pass checked item for item. It prints one line per round; if any pass waits longer
than its deadline, faulthandler prints every thread's stack and the process exits 1.

    python -m tests.persistent_stress ROUNDS DEADLINE_SECONDS
"""

from __future__ import annotations

import faulthandler
import sys

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from dist_resume import ResumableDataLoader

SIZES = (0, 4, 20)  # items of worker 0, 1, 2: one worker has none, one ends early
EXPECTED = sorted(item for size in SIZES for item in range(size))


class WorkerSpecific(IterableDataset):
    """Worker `w` yields range(SIZES[w]) (torch's WorkerSpecificIterableDataset)."""

    def __iter__(self):
        return iter(range(SIZES[get_worker_info().id]))

    def __len__(self) -> int:
        return sum(SIZES)


class Counting(IterableDataset):
    def __iter__(self):
        return iter(range(20))


class CountingMap(Dataset):
    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> int:
        return index


def loader(dataset, **settings) -> ResumableDataLoader:
    return ResumableDataLoader(dataset, persistent_workers=True, **settings)


def iterable_round(prefetch_factor: int) -> None:
    """Three full passes of one loader, a pass abandoned after one item, a fourth pass,
    unbatched and in batches of 7; a pass beyond len() too (torch's warning case)."""
    for batch_size in (None, 7):
        data = loader(WorkerSpecific(), num_workers=3, batch_size=batch_size, prefetch_factor=prefetch_factor)
        for _ in range(3):
            assert flat(data) == EXPECTED
        abandoned = iter(data)
        next(abandoned)
        assert flat(data) == EXPECTED
        del abandoned
    counting = loader(Counting(), num_workers=3, batch_size=1, prefetch_factor=prefetch_factor)
    assert sorted(flat(counting)) == sorted(list(range(20)) * 3)  # no split by worker: each yields all


def conversion_round() -> None:
    """Loaders dropped right after one `list()`/`tuple()` (their workers shut down by GC)."""
    for kind in (list, tuple):
        for dataset in (CountingMap(), Counting()):
            assert kind(loader(dataset, num_workers=1, batch_size=None)) == kind(range(20))
            batches = kind(loader(dataset, num_workers=1, batch_size=2))
            assert [batch.tolist() for batch in batches] == [[i, i + 1] for i in range(0, 20, 2)]


def flat(data) -> list[int]:
    items: list[int] = []
    for batch in data:
        items.extend(batch.tolist() if isinstance(batch, torch.Tensor) else [batch])
    return sorted(items)


def main(rounds: int, deadline: float) -> None:
    torch.set_num_threads(1)
    for number in range(rounds):
        faulthandler.dump_traceback_later(deadline, exit=True)  # a hang: every stack, then exit 1
        iterable_round(2 + number % 3)
        conversion_round()
        faulthandler.cancel_dump_traceback_later()
        print(f"round {number} passed", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
