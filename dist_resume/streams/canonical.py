"""The fixed rule that builds an epoch's global batches out of canonical reading streams.

A `ShardedStream`'s epoch is read by `C` canonical streams: stream `c` reads the shards at
positions `p` of the epoch's shard order with `p % C == c`, one after another. The epoch
order (`EpochOrder`) takes them round by round: one item of every stream that still has
items, in stream order; it depends on the streams' lengths alone, not on any batch size.
Global step `k` holds positions `[k*G, (k+1)*G)` of it (`G`, the global batch), laid out
stream after stream (`StepLayout`), and rank `r` takes `[r*b, (r+1)*b)` of that layout.
Everything here is integer arithmetic over the streams' lengths, the same on every rank
and worker at every world size (G3); a resume at another `G` continues the epoch order
from the position every rank reached (G2).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any, NamedTuple

from dist_resume.positions.layout import TailMode


class Piece(NamedTuple):
    """Items `[start, start + count)` of the reader `stream` (a canonical stream's number, or
    another key its epoch order names), placed at `offset` of a batch."""

    stream: Any
    start: int
    count: int
    offset: int


class Phase(NamedTuple):
    """Rounds `[first_round, end_round)`, from epoch position `position`, over the streams
    of `end_round` items or more."""

    position: int
    first_round: int
    end_round: int


class EpochOrder:
    """An epoch's items, round by round, over canonical streams of `lengths` items."""

    def __init__(self, lengths: Sequence[int]) -> None:
        self.lengths = tuple(lengths)
        self.total = sum(self.lengths)
        self.phases: list[Phase] = []
        position, first = 0, 0
        for end in sorted(set(self.lengths) - {0}):
            self.phases.append(Phase(position, first, end))
            position += (end - first) * sum(length >= end for length in self.lengths)
            first = end
        self._starts = [phase.position for phase in self.phases]
        self._alive: tuple[int, tuple[int, ...]] = (-1, ())

    def alive(self, phase: int) -> tuple[int, ...]:
        """The streams read in phase `phase`, in stream order."""
        if self._alive[0] != phase:
            end = self.phases[phase].end_round
            self._alive = (phase, tuple(c for c, length in enumerate(self.lengths) if length >= end))
        return self._alive[1]

    def chunks(self, start: int, stop: int) -> list[Piece]:
        """The items at positions `[start, stop)` (within the epoch), stream by stream:
        each stream's items there are consecutive, laid out in stream order from offset 0."""
        spans: dict[int, list[int]] = {}
        phase = bisect.bisect_right(self._starts, start) - 1
        while start < stop:
            position, first_round, end_round = self.phases[phase]
            alive = self.alive(phase)
            width = len(alive)
            end = min(stop, position + (end_round - first_round) * width)
            low, high = start - position, end - position
            for j, stream in enumerate(alive):
                # rounds r with r * width + j in [low, high)
                first, last = -((j - low) // width), -((j - high) // width)
                if first < last:
                    span = spans.setdefault(stream, [first_round + first, 0])
                    span[1] += last - first
            start, phase = end, phase + 1
        pieces, offset = [], 0
        for stream in sorted(spans):
            first, count = spans[stream]
            pieces.append(Piece(stream, first, count, offset))
            offset += count
        return pieces

    def owner(self, stream: int, roles: int) -> int:
        """The worker role of a rank that reads canonical stream `stream` for it."""
        return owner(stream, roles)


def window(pieces: Sequence[Piece], low: int, high: int) -> list[Piece]:
    """The part of a layout at offsets `[low, high)`, offsets counted from `low`."""
    kept = []
    for stream, start, count, offset in pieces:
        begin, end = max(low, offset), min(high, offset + count)
        if begin < end:
            kept.append(Piece(stream, start + begin - offset, end - begin, begin - low))
    return kept


class StepLayout:
    """Each rank's batches of an epoch from epoch position `origin` on: its `j`-th batch
    is `[r*b, (r+1)*b)` of global step `[origin + j*G, origin + (j+1)*G)`, laid out stream
    after stream. The final, partial step is, by `mode` (as for map-style data, G2):
    dropped; padded with the epoch's first positions (wrapping to its start, laid out
    after the step's own items), so every rank gets the same number of batches; or cut
    short (ranks past its end get one batch less)."""

    def __init__(self, order: EpochOrder, origin: int, world_size: int, batch_size: int, mode: TailMode) -> None:
        self.order = order
        self.origin = origin
        self.batch_size = batch_size
        self.global_batch = world_size * batch_size
        self.mode = mode

    def num_batches(self, rank: int) -> int:
        """Batches rank `rank` gets from `origin` to the epoch's end."""
        full, partial = divmod(self.order.total - self.origin, self.global_batch)
        if self.mode is TailMode.DROP:
            return full
        if self.mode is TailMode.PAD:
            return full + (partial > 0)
        return full + (partial > rank * self.batch_size)

    def end(self, step: int) -> int:
        """The epoch position after step `step`."""
        return min(self.origin + (step + 1) * self.global_batch, self.order.total)

    def batch(self, rank: int, step: int) -> list[Piece]:
        """Rank `rank`'s batch of step `step` (counted from `origin`), piece by piece."""
        start = self.origin + step * self.global_batch
        stop = self.end(step)
        layout = self.order.chunks(start, stop)
        padding, offset = start + self.global_batch - stop, stop - start
        while self.mode is TailMode.PAD and padding > 0:
            wrapped = min(padding, self.order.total)
            layout += [piece._replace(offset=piece.offset + offset) for piece in self.order.chunks(0, wrapped)]
            padding, offset = padding - wrapped, offset + wrapped
        return window(layout, rank * self.batch_size, (rank + 1) * self.batch_size)


def owner(stream: int, roles: int) -> int:
    """The worker role of a rank that reads canonical stream `stream` for it."""
    return stream % roles
