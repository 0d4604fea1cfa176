"""Which batches of a rank's epoch reached the training loop when workers return them out
of order (`in_order=False`): the consumed prefix, and what was delivered beyond it.

Saved as the batches *not* delivered below the highest delivered one (the holes): a batch
is only ever missing there while it is in flight, so the state holds at most
`num_workers * prefetch_factor` of them, whatever the dataset's length (G5).

Entry of rank `r` of a loader with `in_order=False` (absent with `in_order=True`)::

    "rank_r": {DELIVERED_KEY: int64[1 + H]}   # [frontier, hole, hole, ...], holes ascending

Its size changes with the holes, so plain `dcp.load` of a state with holes into a fresh
loader fails DCP's size check on a key whose name says what to use: holes are re-planned
over every rank, which needs every rank's entry (`load_checkpoint` gives them).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import torch

from dist_resume.state.fields import ResumeStateError

DELIVERED_KEY = "delivered__load_with_dist_resume_load_checkpoint"


class Delivered:
    """The batches `0 .. frontier-1` of a rank's epoch were delivered, except `holes`;
    none from `frontier` on. `prefix` (the first hole, else the frontier) is the consumed
    prefix."""

    def __init__(self, frontier: int = 0, holes: list[int] | None = None) -> None:
        self.frontier = frontier
        self.holes: list[int] = sorted(holes or [])

    @property
    def prefix(self) -> int:
        return self.holes[0] if self.holes else self.frontier

    @property
    def ahead(self) -> bool:
        """Whether anything was delivered beyond the prefix."""
        return bool(self.holes)

    def deliver(self, batch: int) -> None:
        """Batch `batch` (its index in the rank's epoch) was handed to the training loop."""
        if batch >= self.frontier:
            self.holes.extend(range(self.frontier, batch))
            self.frontier = batch + 1
            return
        at = bisect.bisect_left(self.holes, batch)
        if at == len(self.holes) or self.holes[at] != batch:
            raise RuntimeError(f"batch {batch} of this epoch was delivered twice")
        del self.holes[at]

    def pending(self, total: int) -> Iterator[int]:
        """The batches of an epoch of `total` not delivered yet: the holes, then the rest."""
        yield from self.holes
        yield from range(self.frontier, total)

    def encode(self) -> torch.Tensor:
        return torch.tensor([self.frontier, *self.holes], dtype=torch.int64)

    @classmethod
    def decode(cls, values: Any, key: str, prefix: int) -> Delivered:
        """The entry `encode` wrote for a rank whose state says `prefix` batches were
        consumed; anything that does not fit is a ResumeStateError. (Whether the frontier
        lies within the rank's epoch is checked where the epoch's layout is known.)"""
        if not isinstance(values, torch.Tensor) or values.dtype != torch.int64 or values.dim() != 1 or not len(values):
            raise ResumeStateError(f"loader state entry {key!r} has no non-empty 1-D int64 {DELIVERED_KEY!r} tensor")
        frontier, *holes = values.tolist()
        ascending = all(a < b for a, b in zip(holes, holes[1:]))
        if not holes and frontier == prefix:
            return cls(frontier)
        if not holes or holes[0] != prefix or not ascending or not holes[-1] < frontier:
            raise ResumeStateError(
                f"loader state entry {key!r} is impossible: delivered {[frontier, *holes]} is not a frontier "
                f"above ascending holes that start at its {prefix} consumed batches"
            )
        return cls(frontier, holes)

