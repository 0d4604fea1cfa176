"""Where a rank is in its epoch, and the iterator that advances it batch by batch."""

from __future__ import annotations

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
        return batch
