"""One canonical stream's items, read by index: forward through its shards, skipping
whole shards by their item counts without opening them, each next shard opened while the
one before is read; the stream's `transform` applied to each item taken, under the item's
seed (G4)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.randomness.seeds import derive_seeds
from dist_resume.streams.prefetch import ShardFiles
from dist_resume.streams.shard_files import ShardItems


class ItemTransform:
    """`transform` of the items of canonical stream `stream` (of `canonical_streams`) in
    epoch `epoch`: item `i` sits at epoch position `i * canonical_streams + stream` and, with
    `seeding`, is transformed under the seed `(seeding.seed, epoch, position)` (G4)."""

    def __init__(self, transform: Callable[[Any], Any], seeding: ItemSeeding | None, epoch: int, stream: int,
                 canonical_streams: int) -> None:
        self._transform = transform
        self._seeding = seeding
        self._epoch = epoch
        self._stream, self._streams = stream, canonical_streams

    def __call__(self, start: int, values: list[Any]) -> list[Any]:
        """`values`, items `[start, start + len(values))` of the stream, transformed."""
        if self._seeding is None:
            return [self._transform(value) for value in values]
        streams, first = self._streams, start * self._streams + self._stream
        seeds = derive_seeds(self._seeding.seed, self._epoch, range(first, first + len(values) * streams, streams))
        return self._seeding.each(self._transform, values, seeds)


class CanonicalReader:
    """The items of `spans` ((url, shard index, the shard's item count, first item, end
    item), in reading order), one after another, each taken one through `transform`."""

    def __init__(self, spans: Sequence[tuple[str, int, int, int, int]], items: ShardItems,
                 transform: ItemTransform | None = None) -> None:
        self._spans = list(spans)
        self._items = items
        self._transform = transform
        self._ends = list(itertools.accumulate(end - first for _, _, _, first, end in self._spans))
        self._position = -1  # index of the next item of self._iterator; -1: none open
        self._blocks: Generator[list[Any], None, None] | None = None  # what self._iterator chains
        self._iterator: Iterator[Any] = iter(())

    def take(self, start: int, count: int) -> list[Any]:
        """Items `[start, start + count)`: read on from the last call's end through its shard
        (passing over other ranks' items), else from the shard that holds `start`."""
        if self._position <= start < self._shard_end(self._position):
            for _ in itertools.islice(self._iterator, start - self._position):
                pass
        elif start != self._position:
            self.close()
            self._blocks = self._from(start)
            self._iterator = itertools.chain.from_iterable(self._blocks)
        values = list(itertools.islice(self._iterator, count))
        self._position = start + count
        return values if self._transform is None else self._transform(start, values)

    def _shard_end(self, position: int) -> int:
        """The end of the shard that holds item `position` (0 if none is open)."""
        if position < 0:
            return 0
        index = bisect.bisect_right(self._ends, position)
        return self._ends[index] if index < len(self._ends) else 0

    def close(self) -> None:
        """Close the shard being read now (its generator refers back to this reader, so
        dropping the reader alone leaves the file open until a garbage collection)."""
        if self._blocks is not None:
            self._blocks.close()
        self._blocks, self._iterator = None, iter(())
        self._position = -1

    def all(self) -> Iterator[Any]:
        """Every item, in order (transformed, unseeded: a plain DataLoader's reading)."""
        items = itertools.chain.from_iterable(self._from(0))
        if self._transform is None:
            return items
        return (self._transform(index, [value])[0] for index, value in enumerate(items))

    def _from(self, start: int) -> Generator[list[Any], None, None]:
        """Lists of the items from `start` on."""
        first = bisect.bisect_right(self._ends, start)
        skip = start - (self._ends[first - 1] if first else 0)
        spans = self._spans[first:]
        # While one shard is read, the next one opens (closed if this read is abandoned).
        with ShardFiles([url for url, *_ in spans], self._items.storage_options) as files:
            for url, shard, count, begin, end in spans:
                yield from self._items.blocks(url, shard, count, begin + skip, end, files)
                skip = 0
