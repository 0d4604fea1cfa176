"""How a stream of positions is cut into global steps and per-rank batches (GUARANTEES G2)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TailMode(enum.IntEnum):
    """What happens to the final, partial global step of an epoch."""

    DROP = 0  # drop_last=True: dropped
    PAD = 1  # drop_last=False, even_batches=True: padded from the start of the epoch
    UNEVEN = 2  # drop_last=False, even_batches=False: ranks may get one batch less

    @classmethod
    def of(cls, drop_last: bool, even_batches: bool) -> TailMode:
        if drop_last:
            return cls.DROP
        return cls.PAD if even_batches else cls.UNEVEN


@dataclass(frozen=True)
class Batch:
    """One rank's batch: stream slots `[start, stop)` then `padding` wrapped slots.

    Padding slot `i` (counted over the whole epoch from `padding_start`) stands for
    position `i % dataset_length`: the start of the epoch order, wrapped around.
    """

    start: int
    stop: int
    padding_start: int = 0
    padding: int = 0

    def __len__(self) -> int:
        return self.stop - self.start + self.padding


@dataclass(frozen=True)
class Layout:
    """A stream of `length` slots served by `world_size` ranks, `batch_size` each per step.

    Global step `k` is slots `[k*G, (k+1)*G)` with `G = world_size * batch_size`; rank
    `r` takes the `r`-th block of `batch_size` slots. The final partial step follows
    `mode`; with PAD it is split into equal blocks of `ceil(R / world_size)` slots,
    so padding is fewer than `world_size` slots.
    """

    length: int
    world_size: int
    batch_size: int
    mode: TailMode

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world size must be >= 1, got {self.world_size}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.length < 0:
            raise ValueError(f"stream length must be >= 0, got {self.length}")

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size

    @property
    def full_steps(self) -> int:
        return self.length // self.global_batch

    @property
    def remainder(self) -> int:
        return self.length % self.global_batch

    def _tail_block(self) -> int:
        return -(-self.remainder // self.world_size)

    def num_batches(self, rank: int) -> int:
        """Batches rank `rank` serves over the whole stream."""
        steps = self.full_steps
        if self.remainder == 0 or self.mode is TailMode.DROP:
            return steps
        if self.mode is TailMode.PAD:
            return steps + 1
        return steps + (self.remainder > rank * self.batch_size)

    def slots_before(self, rank: int, index: int) -> int:
        """Slots (padding included) in the first `index` batches of rank `rank`."""
        full = min(index, self.full_steps)
        return full * self.batch_size + (len(self.batch(rank, full)) if index > full else 0)

    def batch(self, rank: int, index: int) -> Batch:
        """The `index`-th batch of rank `rank` (0-based, below `num_batches(rank)`)."""
        steps = self.full_steps
        step_start = index * self.global_batch
        if index < steps:
            start = step_start + rank * self.batch_size
            return Batch(start, start + self.batch_size)
        if self.mode is TailMode.UNEVEN:
            start = step_start + rank * self.batch_size
            return Batch(start, min(start + self.batch_size, self.length))
        block = self._tail_block()
        start = step_start + rank * block
        real_start = min(start, self.length)
        real_stop = min(start + block, self.length)
        padded_from = max(start, self.length)
        padding = max(0, start + block - padded_from)
        return Batch(real_start, real_stop, padded_from - self.length, padding)
