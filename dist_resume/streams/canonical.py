"""The fixed rule that builds an epoch's global batches out of canonical reading streams.

A `ShardedStream`'s epoch is read by `C` canonical streams of equal length (the first
`T % C` one item longer; `sharded.stream_spans` says which shard items each reads). The
epoch order takes one item of each stream in turn: position `m` is item `m // C` of stream
`m % C`. It depends on the streams' lengths alone, not on any batch size.

Global step `k` holds positions `[k*G, (k+1)*G)` (`G`, the global batch), laid out stream
after stream: chunk `c` is stream `c`'s items among them. The final step may reach past
the epoch's end; its missing items are padding, taken from the start of the same stream
(so a rank that reads a stream's chunk pads it from that stream). Rank `r` takes
`[r*b, (r+1)*b)` of the layout. Everything here is integer arithmetic, the same on every
rank and worker at every world size (G3); a resume at another `G` continues from the epoch
position every rank reached (G2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from dist_resume.positions.layout import TailMode

SHAPE_PIECES = 1 << 16  # pieces a StepLayout keeps of the shapes of full steps


class Piece(NamedTuple):
    """Items `[start, start + count)` of canonical stream `stream` (or of the reader another
    step source's key names), placed at `offset` of a batch; `padding`: repeated from the
    stream's start to fill the final step."""

    stream: Any
    start: int
    count: int
    offset: int
    padding: bool = False


def stream_lengths(total: int, canonical_streams: int) -> list[int]:
    """Items of each canonical stream: `total` cut into runs of equal length, the first
    `total % canonical_streams` one item longer."""
    base, extra = divmod(total, canonical_streams)
    return [base + (stream < extra) for stream in range(canonical_streams)]


def step_chunks(lengths: Sequence[int], start: int, size: int) -> list[Piece]:
    """The layout of the step at positions `[start, start + size)`, stream by stream;
    positions past the epoch's end become padding from the start of their stream (of the
    epoch, for a stream without items)."""
    streams, total = len(lengths), sum(lengths)
    pieces, offset = [], 0
    for stream, length in enumerate(lengths):
        first = start + (stream - start) % streams  # the step's first position of this stream
        count = max(0, -(-(start + size - first) // streams))
        index = first // streams
        real = max(0, min(count, length - index))
        if real:
            pieces.append(Piece(stream, index, real, offset))
        pieces += _padding(lengths, total, stream, index + real - length, count - real, offset + real)
        offset += count
    return pieces


def _padding(lengths: Sequence[int], total: int, stream: int, skip: int, count: int, offset: int) -> list[Piece]:
    """`count` padding items of `stream` from its `skip`-th repeated item on, wrapping."""
    pieces = []
    length = lengths[stream]
    while count > 0:
        if length:
            start = skip % length
            taken = min(count, length - start)
            pieces.append(Piece(stream, start, taken, offset, True))
        else:  # an empty stream (fewer items than streams): the epoch's first items, in order
            position = (stream + skip * len(lengths)) % total
            pieces.append(Piece(position % len(lengths), position // len(lengths), 1, offset, True))
            taken = 1
        skip, count, offset = skip + taken, count - taken, offset + taken
    return pieces


def window(pieces: Sequence[Piece], low: int, high: int) -> list[Piece]:
    """The part of a layout at offsets `[low, high)`, offsets counted from `low`."""
    kept = []
    for piece in pieces:
        begin, end = max(low, piece.offset), min(high, piece.offset + piece.count)
        if begin < end:
            kept.append(piece._replace(start=piece.start + begin - piece.offset, count=end - begin,
                                       offset=begin - low))
    return kept


class StepLayout:
    """Each rank's batches of an epoch from epoch position `origin` on: its `j`-th batch is
    `[r*b, (r+1)*b)` of the step at `[origin + j*G, origin + (j+1)*G)`. The final, partial
    step is, by `mode` (as for map-style data, G2): dropped; padded, so every rank gets the
    same number of batches; or cut short (no padding: ranks whose part of it is all padding
    get one batch less, others a smaller batch)."""

    def __init__(self, lengths: Sequence[int], origin: int, world_size: int, batch_size: int,
                 mode: TailMode) -> None:
        self.lengths = tuple(lengths)
        self.total = sum(self.lengths)
        self.origin = origin
        self.batch_size = batch_size
        self.global_batch = world_size * batch_size
        self.mode = mode
        self._shapes: dict[tuple[int, int], list[Piece]] = {}
        self._shaped_pieces = 0

    def num_batches(self, rank: int) -> int:
        """Batches rank `rank` gets from `origin` to the epoch's end."""
        full, partial = divmod(self.total - self.origin, self.global_batch)
        if self.mode is TailMode.DROP or not partial:
            return full
        return full + (self.mode is TailMode.PAD or bool(self.batch(rank, full)))

    def end(self, step: int) -> int:
        """The epoch position after step `step`."""
        return min(self.origin + (step + 1) * self.global_batch, self.total)

    def batch(self, rank: int, step: int) -> list[Piece]:
        """Rank `rank`'s batch of step `step` (counted from `origin`), piece by piece."""
        start = self.origin + step * self.global_batch
        if start + self.global_batch > self.total:
            return self._batch(rank, start)
        # A full step (no padding) is the full step at `start % C` with every stream's items
        # `start // C` further on: its shape is computed once per rank and phase.
        shift, phase = divmod(start, len(self.lengths))
        shape = self._shapes.get((rank, phase))
        if shape is None:
            shape = self._batch(rank, phase)
            if self._shaped_pieces + len(shape) <= SHAPE_PIECES:  # bounded at huge C: C / gcd(G, C) phases
                self._shapes[rank, phase] = shape
                self._shaped_pieces += len(shape)
        return [Piece(piece.stream, piece.start + shift, piece.count, piece.offset) for piece in shape]

    def _batch(self, rank: int, start: int) -> list[Piece]:
        """Rank `rank`'s part of the step at epoch position `start`."""
        layout = step_chunks(self.lengths, start, self.global_batch)
        mine = window(layout, rank * self.batch_size, (rank + 1) * self.batch_size)
        if self.mode is TailMode.PAD:
            return mine
        real, offset = [], 0
        for piece in mine:
            if not piece.padding:
                real.append(piece._replace(offset=offset))
                offset += piece.count
        return real

    def owner(self, stream: int, roles: int) -> int:
        """The worker role of a rank that reads canonical stream `stream` for it."""
        return owner(stream, roles)


def owner(stream: int, roles: int) -> int:
    """The worker role of a rank that reads canonical stream `stream` for it."""
    return stream % roles
