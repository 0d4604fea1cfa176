"""A Mixture of streams read with `in_order=False`: the items of a loader epoch's positions,
position by position, so that a worker builds whole batches of a run of positions
(`streams.unordered_pass` cuts the rest of the epoch into such runs).

Position `p` reads the draw of its source that the schedule gives it, as `MixtureOrder`
does for map-style sources. A stream source's draw `d` is item `d % T` of its source-epoch
`d // T`, its items read one after another in the epoch's shard order (one canonical
stream): a run of positions reads each source's items forward, so a worker reads each shard
once but for a shard cut between runs (its start is read past). A map-style source's draw
reads its source order, as in order. Each source is still read once per source-epoch: a
loader epoch's positions are its draws, each position trained once (G2). An item's seed
is fixed by the source, source-epoch and item (G4), not by who reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from dist_resume.mixtures.schedule import Schedule


class MixturePositions:
    """`take(start, count)`: the items of loader-epoch positions `[start, start + count)`.
    `reader(source, source_epoch)`: what reads a source's items by index (`source_epoch`
    -1 for a map-style source, whose readers take draw numbers)."""

    def __init__(self, schedule: Schedule, lengths: Sequence[int], streamed: Sequence[bool], epoch_start: int,
                 reader: Callable[[int, int], Any]) -> None:
        self._schedule = schedule
        self._lengths = lengths
        self._streamed = streamed
        self._epoch_start = epoch_start
        self._reader = reader
        self._readers: dict[tuple[int, int], Any] = {}

    def take(self, start: int, count: int) -> list[Any]:
        positions = torch.arange(self._epoch_start + start, self._epoch_start + start + count, dtype=torch.int64)
        sources, draws = self._schedule.assign(positions)
        sources_list = sources.tolist()
        by_source: dict[int, list[Any]] = {}
        for source in sorted(set(sources_list)):
            chosen = draws[sources == source].tolist()  # consecutive: a source's draws follow its positions
            by_source[source] = self._draws(source, chosen[0], len(chosen))
        cursors = dict.fromkeys(by_source, 0)
        items = []
        for source in sources_list:
            items.append(by_source[source][cursors[source]])
            cursors[source] += 1
        return items

    def _draws(self, source: int, first: int, count: int) -> list[Any]:
        if not self._streamed[source]:
            return self._open(source, -1).take(first, count)
        items, length = [], self._lengths[source]
        while count:
            epoch, within = divmod(first, length)
            taken = min(count, length - within)
            items += self._open(source, epoch).take(within, taken)
            first, count = first + taken, count - taken
        return items

    def _open(self, source: int, epoch: int) -> Any:
        key = (source, epoch)
        if key not in self._readers:
            # A later source-epoch retires the earlier ones' readers and the shards they hold
            # open (a final batch's padding reopens one if it needs it).
            for old in [old for old in self._readers if old[0] == source and 0 <= old[1] < epoch]:
                self._close(self._readers.pop(old))
            self._readers[key] = self._reader(source, epoch)
        return self._readers[key]

    def close(self) -> None:
        for reader in self._readers.values():
            self._close(reader)
        self._readers.clear()

    @staticmethod
    def _close(reader: Any) -> None:
        if callable(getattr(reader, "close", None)):
            reader.close()
