"""Where a rank is in its epoch, and the iterator that advances it batch by batch."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

from dist_resume.positions.elastic_plan import Plan
from dist_resume.state.delivered import Delivered


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
        # in_order=False: the batches delivered out of order; `batches` is their prefix.
        self.delivered: Delivered | None = None

    @property
    def started(self) -> bool:
        """Whether a batch of the epoch was consumed, or the epoch is over."""
        return bool(self.batches or self.finished or (self.delivered is not None and self.delivered.frontier))


class ResumingIterator:
    """Yields the inner DataLoader's batches and reports each one handed on (`consumed`) and
    the end of the pass (`exhausted`); stops with an error once `is_current()` is False."""

    def __init__(self, inner: Iterator[Any], batches: Iterator[Any], *, is_current: Callable[[], bool],
                 consumed: Callable[[], None], exhausted: Callable[[], None], length: Callable[[], int],
                 stream_length: StreamLength | None = None) -> None:
        self._inner = inner
        self._batches = batches  # torch's iterator under `inner`
        self._is_current = is_current
        self._consumed = consumed
        self._exhausted = exhausted
        self._length = length
        self._stream_length = stream_length
        self._ended = False

    @property
    def _workers(self) -> list[Any]:
        """The worker processes, as torch's iterator names them (code that joins them reads this)."""
        return getattr(self._batches, "_workers", [])

    def __iter__(self) -> ResumingIterator:
        return self

    def __len__(self) -> int:
        return self._length()

    def __next__(self) -> Any:
        if self._ended:
            raise StopIteration
        if not self._is_current():
            self._inner = iter(())
            raise RuntimeError(
                "this ResumableDataLoader iterator is stale: the loader was re-iterated, or "
                "load_state_dict()/set_epoch()/skip() moved it; call iter(loader) to continue from its position"
            )
        try:
            batch = next(self._inner)
        except StopIteration:
            self._ended = True
            self._exhausted()
            raise
        self._consumed()
        if self._stream_length is not None:
            self._stream_length.count_batch()
        return batch


class StreamLength:
    """As torch's iterator: once len(loader) was read (`reported`), a stream that yields
    more batches than that warns (worker replicas of a stream that is not split, say)."""

    def __init__(self, reported: int | None, dataset: Any, num_workers: int) -> None:
        self._reported = reported
        self._dataset = dataset
        self._num_workers = num_workers
        self._yielded = 0

    def count_batch(self) -> None:
        """One more batch of the pass was yielded; past the reported length, warn."""
        self._yielded += 1
        if self._reported is None or self._yielded <= self._reported:
            return
        message = (f"Length of IterableDataset {self._dataset} was reported to be {self._reported} (when "
                   f"accessing len(dataloader)), but {self._yielded} samples have been fetched. ")
        if self._num_workers > 0:
            message += ("For multiprocessing data-loading, this could be caused by not properly configuring the "
                        "IterableDataset replica at each worker. Please see "
                        "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")
        warnings.warn(message, stacklevel=3)
