"""What `ResumableDataLoader.skip` passed over: the skipped ranges a loader state records.

Each rank's entry holds the same `SKIPS_KEY` tensor (every rank skips the same global
batches), so a save can tell ranks that skipped differently apart, and any saved rank's copy
serves a resume at another world size. Layout, all int64::

    [base_epoch, base_batches, count, count x (the 8 fields of SkippedRange)]

`base_batches` is the global batch number, in epoch `base_epoch`, of the first global batch
the current job lays out: 0 for a fresh epoch, the batches earlier jobs served when it was
resumed at another world size or batch size. The list holds at most `MAX_SKIPPED_RANGES`
ranges: a range that continues the newest one extends it, and when the list is full the two
oldest are merged into one that spans both and keeps their exact counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass, fields
from typing import Any

import torch

from dist_resume.state.fields import ResumeStateError, rank_key, rank_of

SKIPS_KEY = "skipped"
MAX_SKIPPED_RANGES = 8


@dataclass(frozen=True)
class SkippedRange:
    """Global batches and epoch positions that `skip` passed over: never trained.

    It spans from global batch `first_batch` (position `first_position`) of `first_epoch`
    to just before global batch `stop_batch` (position `stop_position`) of `last_epoch`;
    `batches` global batches and `positions` positions of that span were skipped, all of it
    when `exact` (a range merged from others, or laid over positions left by ranks that
    stopped at different steps, may hold trained ones between them)."""

    first_epoch: int
    first_batch: int
    first_position: int
    last_epoch: int
    stop_batch: int
    stop_position: int
    batches: int
    positions: int

    @property
    def exact(self) -> bool:
        """Whether every global batch and position of the span was skipped."""
        return (self.first_epoch == self.last_epoch and self.stop_batch - self.first_batch == self.batches
                and self.stop_position - self.first_position == self.positions)

    def __str__(self) -> str:
        if self.exact:
            return (f"epoch {self.first_epoch}: global batches {self.first_batch} to {self.stop_batch - 1} "
                    f"({self.batches}), positions {self.first_position} to {self.stop_position - 1} "
                    f"({self.positions})")
        return (f"epoch {self.first_epoch} global batch {self.first_batch} to epoch {self.last_epoch} global "
                f"batch {self.stop_batch - 1}: {self.batches} of these global batches, and {self.positions} "
                f"positions between epoch {self.first_epoch} position {self.first_position} and epoch "
                f"{self.last_epoch} position {self.stop_position - 1}, were skipped")

    def continued_by(self, later: SkippedRange) -> bool:
        return (self.last_epoch, self.stop_batch, self.stop_position) == (
            later.first_epoch, later.first_batch, later.first_position) and later.first_epoch == later.last_epoch

    def merged(self, other: SkippedRange) -> SkippedRange:
        """One range spanning both, with both counts."""
        first = min((self.first_epoch, self.first_batch), (other.first_epoch, other.first_batch))
        first_position = min((self.first_epoch, self.first_position), (other.first_epoch, other.first_position))
        last = max((self.last_epoch, self.stop_batch), (other.last_epoch, other.stop_batch))
        stop_position = max((self.last_epoch, self.stop_position), (other.last_epoch, other.stop_position))
        return SkippedRange(first[0], first[1], first_position[1], last[0], last[1], stop_position[1],
                            self.batches + other.batches, self.positions + other.positions)


_WIDTH = len(fields(SkippedRange))


@dataclass(frozen=True)
class SkipLedger:
    """A loader's skipped ranges, oldest first, and the numbering of its global batches."""

    ranges: tuple[SkippedRange, ...] = ()
    base_epoch: int = 0
    base_batches: int = 0

    def global_batch(self, epoch: int, batch: int) -> int:
        """The global batch number in `epoch` of the current job's `batch`-th global batch."""
        return batch + (self.base_batches if epoch == self.base_epoch else 0)

    def adding(self, skipped: SkippedRange) -> SkipLedger:
        ranges = list(self.ranges)
        if ranges and ranges[-1].continued_by(skipped):
            ranges[-1] = ranges[-1].merged(skipped)
        else:
            ranges.append(skipped)
        if len(ranges) > MAX_SKIPPED_RANGES:
            ranges[:2] = [ranges[0].merged(ranges[1])]
        return SkipLedger(tuple(ranges), self.base_epoch, self.base_batches)

    def rebased(self, epoch: int, batches_before: int) -> SkipLedger:
        """The ledger of a job that resumes `epoch` after `batches_before` of its global batches."""
        return SkipLedger(self.ranges, epoch, self.global_batch(epoch, batches_before))

    @property
    def empty(self) -> bool:
        return not self.ranges and self.base_batches == 0

    def to_tensor(self) -> torch.Tensor:
        values = [self.base_epoch, self.base_batches, len(self.ranges)]
        for skipped in self.ranges:
            values += astuple(skipped)
        return torch.tensor(values, dtype=torch.int64)

    @classmethod
    def from_tensor(cls, values: Any, key: str) -> SkipLedger:
        where = f"loader state entry {key!r}'s {SKIPS_KEY!r} tensor"
        if not isinstance(values, torch.Tensor) or values.dtype != torch.int64 or values.dim() != 1:
            raise ResumeStateError(f"{where} is not a 1-D int64 tensor")
        numbers = values.tolist()
        if len(numbers) < 3 or not 0 <= numbers[2] <= MAX_SKIPPED_RANGES or len(numbers) != 3 + _WIDTH * numbers[2]:
            raise ResumeStateError(f"{where} has {len(numbers)} values, which no list of at most "
                                   f"{MAX_SKIPPED_RANGES} skipped ranges has")
        if min(numbers[:2]) < 0:
            raise ResumeStateError(f"{where} numbers its global batches from epoch {numbers[0]}, batch {numbers[1]}")
        ranges = tuple(SkippedRange(*numbers[start:start + _WIDTH]) for start in range(3, len(numbers), _WIDTH))
        for skipped in ranges:
            if not _possible(skipped):
                raise ResumeStateError(f"{where} holds an impossible range {astuple(skipped)}")
        return cls(ranges, numbers[0], numbers[1])


def _possible(skipped: SkippedRange) -> bool:
    if min(astuple(skipped)) < 0 or skipped.batches < 1 or skipped.first_epoch > skipped.last_epoch:
        return False
    if skipped.first_epoch < skipped.last_epoch:
        return True
    return skipped.batches <= skipped.stop_batch - skipped.first_batch and \
        skipped.positions <= skipped.stop_position - skipped.first_position


def saved_ledger(state_dict: Mapping[str, Any], ranks: list[int]) -> SkipLedger:
    """The ledger that the entries of `ranks` in a loader state dict hold (none: empty);
    entries that disagree are refused, as a save refuses ranks that skipped differently."""
    ledgers = {}  # of the entries that hold one: at 100,000 saved ranks, no object per other entry
    for rank in ranks:
        key = rank_key(rank)
        entry = state_dict.get(key)
        stored = entry.get(SKIPS_KEY) if isinstance(entry, Mapping) else None
        if stored is not None:
            ledgers[rank] = SkipLedger.from_tensor(stored, key)
    none = SkipLedger()
    distinct = set(ledgers.values()) | ({none} if len(ledgers) < len(ranks) else set())
    if len(distinct) > 1:
        shown = "; ".join(f"rank {rank}: {describe_ranges(ledgers.get(rank, none))}" for rank in sorted(ranks))
        raise ResumeStateError(f"loader state entries disagree on the skipped ranges ({shown}): every rank "
                               "must call skip() with the same number of batches")
    return distinct.pop() if distinct else SkipLedger()


def describe_ranges(ledger: SkipLedger) -> str:
    """The skipped ranges on one line ("none skipped" if none)."""
    return "; ".join(map(str, ledger.ranges)) or "none skipped"


def loader_skips(state: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """For a collective save: every data loader in `state` (a loader, whose `skipped` is a
    tuple of SkippedRange, or a loader's state dict, found in nested mappings too), by its
    dotted key, and the ranges it skipped."""
    found = {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            own = [rank for rank in map(rank_of, value) if rank is not None]
            if own:
                found[name] = describe_ranges(saved_ledger(value, own))
            else:
                found.update(loader_skips(value, f"{name}."))
            continue
        skipped = getattr(value, "skipped", None)
        if isinstance(skipped, tuple) and all(isinstance(entry, SkippedRange) for entry in skipped):
            found[name] = describe_ranges(SkipLedger(skipped))
    return found
