"""Where a rank is in its epoch, and the iterator that advances it batch by batch."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .elastic_plan import Plan

if TYPE_CHECKING:
    from .loader import ResumableDataLoader


class Progress:
    """Where this rank is in its current epoch."""

    def __init__(self, epoch: int, plan: Plan, batches: int = 0, samples: int = 0, finished: bool = False) -> None:
        self.epoch = epoch
        self.plan = plan
        self.batches = batches
        self.samples = samples
        self.finished = finished
        # Set by set_epoch: the next iter() serves this epoch even if it is finished.
        self.chosen = False


class ResumingIterator:
    """Yields the inner DataLoader's batches and tells the loader each one was consumed."""

    def __init__(self, loader: ResumableDataLoader, inner: Iterator[Any], generation: int, batches: Iterator[Any]) -> None:
        self._loader = loader
        self._inner = inner
        self._generation = generation
        self._ended = False
        self._batches = batches  # torch's iterator under `inner`
        # As torch's iterator: once len(loader) was read, a stream that yields more batches
        # than that length warns (worker replicas of a stream that is not split, say).
        self._reported_length = loader._IterableDataset_len_called if loader._stream is not None else None
        self._yielded = 0

    @property
    def _workers(self) -> list[Any]:
        """The worker processes, as torch's iterator names them (code that joins them reads this)."""
        return getattr(self._batches, "_workers", [])

    def __iter__(self) -> ResumingIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        loader = self._loader
        if self._ended:
            raise StopIteration
        if self._generation != loader._generation:
            self._inner = iter(())
            raise RuntimeError(
                "this ResumableDataLoader iterator is stale: the loader was re-iterated, or "
                "load_state_dict()/set_epoch() moved it; call iter(loader) to continue from its position"
            )
        try:
            batch = next(self._inner)
        except StopIteration:
            self._ended = True
            loader._exhausted()
            raise
        loader._consumed()
        if self._reported_length is not None:
            self._yielded += 1
            if self._yielded > self._reported_length:
                self._warn_past_length()
        return batch

    def _warn_past_length(self) -> None:
        loader = self._loader
        message = (f"Length of IterableDataset {loader.dataset} was reported to be {self._reported_length} (when "
                   f"accessing len(dataloader)), but {self._yielded} samples have been fetched. ")
        if loader.num_workers > 0:
            message += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                        "IterableDataset replica at each worker. Please see "
                        "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")
        warnings.warn(message, stacklevel=3)
