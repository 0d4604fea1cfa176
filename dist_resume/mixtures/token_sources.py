"""The real tokens of a packed source's draws, as a Mixture whose weights count tokens
reads them (`token_pacing.DrawTokens`): exactly for sources whose padding lies in known
sequences (streams packed "concat": each shard's last sequence; token files: the last one),
at their average fill for streams packed "fit" (whose every sequence may hold padding)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import numpy

from dist_resume.mixtures.source_orders import SourceOrders
from dist_resume.packing import PackedStream, TokenSequences, padded_places
from dist_resume.randomness.seeds import derive_seed

_INT64_SAFE = 1 << 62
_EPOCHS_KEPT = 4  # source-epochs whose padding a source keeps at once

Padding = tuple[numpy.ndarray, numpy.ndarray]  # increasing places in a source-epoch, the padding of each


def source_tokens(source: Any) -> int:
    """Real tokens of one source-epoch of a packed source (a `PackedStream`'s counted once)."""
    if isinstance(source, PackedStream):
        return sum(source.shard_tokens())
    if isinstance(source, TokenSequences):
        return source.total_tokens
    raise TypeError(f"weights that count tokens need packed sources (packed(), TokenSequences), got "
                    f"{type(source).__name__}")


def tokens_digest(source: Any) -> int:
    """Identifies where a packed source's real tokens lie (each shard's, each file's)."""
    if isinstance(source, PackedStream):
        return derive_seed(len(source.shards), *source.shard_tokens())
    return derive_seed(len(source.file_tokens), *source.file_tokens)


def exact(source: Any) -> bool:
    """Whether the Mixture knows each of `source`'s sequences' real tokens (else only
    their average: a stream packed "fit")."""
    return not (isinstance(source, PackedStream) and source.reader.mode == "fit")


class PaddedDraws:
    """The draws of a source whose sequences are full (`width` real tokens) but for a few
    padded ones, which `padding(source_epoch)` places."""

    def __init__(self, width: int, sequences: int, tokens: int, padding: Callable[[int], Padding],
                 every_epoch_alike: bool) -> None:
        self.width, self.average = width, tokens / sequences
        self._sequences, self._tokens = sequences, tokens
        self._padding = padding
        self._alike = every_epoch_alike
        self._kept: dict[int, tuple[numpy.ndarray, numpy.ndarray, list[int], list[int]]] = {}

    def _epoch(self, epoch: int) -> tuple[numpy.ndarray, numpy.ndarray, list[int], list[int]]:
        key = 0 if self._alike else epoch
        if key not in self._kept:
            if len(self._kept) >= _EPOCHS_KEPT:
                self._kept.pop(next(iter(self._kept)))
            places, paddings = self._padding(key)
            cumulative = numpy.concatenate([[0], numpy.cumsum(paddings)]).astype(numpy.int64)
            self._kept[key] = (places, cumulative, places.tolist(), cumulative.tolist())
        return self._kept[key]

    def before(self, draws: numpy.ndarray) -> numpy.ndarray:
        epochs, within = numpy.divmod(draws, self._sequences)
        wide = (int(epochs.max(initial=0)) + 1) * self._tokens >= _INT64_SAFE
        result = numpy.empty(len(draws), dtype=object if wide else numpy.int64)
        for epoch in numpy.unique(epochs).tolist():
            chosen = epochs == epoch
            places, cumulative, _, _ = self._epoch(epoch)
            mine = within[chosen]
            padding = cumulative[numpy.searchsorted(places, mine, "left")]
            result[chosen] = (mine * self.width - padding).astype(result.dtype) + epoch * self._tokens
        return result

    def before_one(self, draw: int) -> int:
        epoch, within = divmod(draw, self._sequences)
        _, _, places, cumulative = self._epoch(epoch)
        return epoch * self._tokens + within * self.width - cumulative[bisect.bisect_left(places, within)]


class AverageDraws:
    """The draws of a source counted at its average fill: the first `m` draws of a
    source-epoch hold `floor(m * tokens / sequences)` tokens (exact at the source-epoch's
    ends, not in between)."""

    def __init__(self, width: int, sequences: int, tokens: int) -> None:
        self.width, self.average = width, tokens / sequences
        self._sequences, self._tokens = sequences, tokens
        self._whole, self._rest = divmod(tokens, sequences)

    def before(self, draws: numpy.ndarray) -> numpy.ndarray:
        wide = max((int(draws.max(initial=0)) // self._sequences + 1) * self._tokens,
                   self._sequences * self._sequences) >= _INT64_SAFE
        values = draws.astype(object) if wide else draws
        epochs, within = values // self._sequences, values % self._sequences
        return epochs * self._tokens + within * self._whole + within * self._rest // self._sequences

    def before_one(self, draw: int) -> int:
        epoch, within = divmod(draw, self._sequences)
        return epoch * self._tokens + within * self._tokens // self._sequences


def draw_tokens(source: Any, index: int, orders: SourceOrders, canonical_streams: int | None) -> Any:
    """`DrawTokens` of source `index` of a Mixture: its draws read its order (a stream's
    epoch order under `canonical_streams`, a map-style source's order from `orders`)."""
    sequences, tokens = orders.lengths[index], source_tokens(source)
    if isinstance(source, PackedStream):
        width = source.reader.width
        if source.reader.mode == "fit":
            return AverageDraws(width, sequences, tokens)
        if canonical_streams is None:
            raise ValueError("the real tokens of a stream source's draws depend on the canonical streams it is read "
                             "by: give canonical_streams (the loader's, or the Mixture's)")
        return PaddedDraws(width, sequences, tokens, StreamPadding(source, canonical_streams), not source.shuffle)
    return PaddedDraws(source.width, sequences, tokens, LastSequence(orders, index, sequences * source.width - tokens),
                       not orders.shuffle)


class StreamPadding:
    """A packed stream's padding in a source-epoch read by `canonical_streams` streams."""

    def __init__(self, stream: PackedStream, canonical_streams: int) -> None:
        self._stream, self._canonical_streams = stream, canonical_streams

    def __call__(self, epoch: int) -> Padding:
        return padded_places(self._stream, epoch, self._canonical_streams)


class LastSequence:
    """A token file source's padding: its last sequence's, wherever `orders` place it."""

    def __init__(self, orders: SourceOrders, source: int, padding: int) -> None:
        self._orders, self._source, self._padding = orders, source, padding

    def __call__(self, epoch: int) -> Padding:
        if not self._padding:
            return numpy.empty(0, dtype=numpy.int64), numpy.empty(0, dtype=numpy.int64)
        last = self._orders.lengths[self._source] - 1
        return (numpy.array([self._orders.position_of(self._source, epoch, last)], dtype=numpy.int64),
                numpy.array([self._padding], dtype=numpy.int64))
