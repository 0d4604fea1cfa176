"""The inner DataLoader's batches at `num_workers=0`, fetched by the loader's own loop.

torch's single-process iterator opens a profiler scope (`record_function`) around every
batch, profiler or not: about 4 us, a fifth of a batch of cheap samples. These loops do
what that iterator does for the inner DataLoader (next request, the dataset's
`__getitems__`, `collate_fn`; for a stream's, the next item of its dataset, `collate_fn`)
and open the same scope only while a profiler runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd import _profiler_enabled
from torch.autograd.profiler import record_function
from torch.utils.data import DataLoader

# The name torch's iterator gives its scope, so that profiles read the same.
_SCOPE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def serves(inner: DataLoader) -> bool:
    """Whether `SingleProcessBatches` iterates `inner` exactly as torch would: in this process,
    without pinning memory (left to torch) and without a timeout (which torch refuses there)."""
    return inner.num_workers == 0 and not inner.pin_memory and inner.timeout == 0


class SingleProcessBatches:
    """One pass of `inner` (map-style, fetched by batch requests), in this process."""

    def __init__(self, inner: DataLoader) -> None:
        # torch's iterator draws its workers' base seed even without workers: the same
        # draw keeps the caller's generator where a plain DataLoader leaves it.
        torch.empty((), dtype=torch.int64).random_(generator=inner.generator)
        self._requests = iter(inner.batch_sampler)
        self._fetch = inner.dataset.__getitems__
        self._collate = inner.collate_fn

    def __iter__(self) -> SingleProcessBatches:
        return self

    def __next__(self) -> Any:
        if _profiler_enabled():
            with record_function(_SCOPE):
                return self._collate(self._fetch(next(self._requests)))
        return self._collate(self._fetch(next(self._requests)))


class SingleProcessItems:
    """One pass of `inner` (an IterableDataset without automatic batching: each item of it
    is a batch), in this process."""

    def __init__(self, inner: DataLoader) -> None:
        torch.empty((), dtype=torch.int64).random_(generator=inner.generator)  # as SingleProcessBatches
        self._items = iter(inner.dataset)  # after the draw, as torch's iterator
        self._collate = inner.collate_fn

    def __iter__(self) -> SingleProcessItems:
        return self

    def __next__(self) -> Any:
        if _profiler_enabled():
            with record_function(_SCOPE):
                return self._collate(next(self._items))
        return self._collate(next(self._items))
