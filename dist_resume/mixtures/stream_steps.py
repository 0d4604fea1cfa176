"""A Mixture with `ShardedStream` sources, read by global steps as a single stream is.

The run's positions `[k*G, (k+1)*G)` (global step `k`) fix its items: each position's
`(source, draw)` comes from the schedule, as for map-style sources. A stream source's draw
`d` is position `m = d % T` (`T` its items) of its epoch order of source-epoch `d // T`:
item `m // C` of its canonical stream `m % C`; a map-style source's draw reads its source
order (seeded by the loader's seed and `shuffle`). A step's draws of a source are
consecutive, so a step is a few runs of items per source. It is laid out canonical stream
first (stream `c` of every source, in source order, then a `1/C` run of the step's
map-style draws, then stream `c + 1`), so that map-style items move no stream boundary
far; rank `r` takes `[r*b, (r+1)*b)` of it (`MixtureLayout`). All of it is arithmetic on the schedule
and the sources' item counts: the same at every world size and `num_workers` (G3). The
final, partial step of a loader epoch is dropped, cut short, or padded with the epoch's
first positions (wrapping), as for map-style data (G2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset

from dist_resume.mixtures.schedule import Schedule
from dist_resume.mixtures.source_orders import SourceOrders, name_key
from dist_resume.mixtures.unordered_positions import MixturePositions
from dist_resume.positions.layout import TailMode
from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.randomness.seeds import derive_seed, derive_seeds
from dist_resume.streams.canonical import Piece, owner, step_chunks, window
from dist_resume.streams.sharded import ShardedStream
from dist_resume.streams.steps import StepSettings


class SourceKey(NamedTuple):
    """What reads a piece: canonical stream `stream` of source-epoch `epoch` of stream source
    `source`; or, with `epoch` -1, the draws of map-style source `source` laid out after
    canonical stream `stream`."""

    source: int
    epoch: int
    stream: int

    def supersedes(self, other: object) -> bool:
        """Whether `other` reads an earlier source-epoch of the same canonical stream, which
        the layout, going forward, no longer needs (the final step's padding reopens it)."""
        return (isinstance(other, SourceKey) and (other.source, other.stream) == (self.source, self.stream)
                and 0 <= other.epoch < self.epoch)


class MixtureStepOrder:
    """Loader epoch `epoch`'s positions of a Mixture of streams, as `chunks` of readers."""

    def __init__(self, schedule: Schedule, sources: Sequence[Any], lengths: Sequence[int], run_start: int,
                 total: int, canonical_streams: int) -> None:
        self._schedule = schedule
        self._sources = sources
        self._lengths = lengths
        self._run_start = run_start
        self.total = total
        self._canonical_streams = canonical_streams
        self._stream_lengths = [source.stream_lengths(canonical_streams) if isinstance(source, ShardedStream)
                                else [] for source in sources]

    def chunks(self, start: int, stop: int) -> list[Piece]:
        """The items at positions `[start, stop)` of the epoch: canonical stream by canonical
        stream, every stream source's items of it in source order, then its run of the
        map-style draws."""
        before = self._schedule.draws_before(self._run_start + start)
        after = self._schedule.draws_before(self._run_start + stop)
        # (canonical stream, 0 for stream items / 1 for map-style ones, source, source-epoch, first, count)
        laid: list[tuple[int, int, int, int, int, int]] = []
        mapped: list[tuple[int, int, int]] = []  # (source, first draw, count)
        for source, (first, end) in enumerate(zip(before, after)):
            if first == end:
                continue
            if not isinstance(self._sources[source], ShardedStream):
                mapped.append((source, first, end - first))
                continue
            draw = first
            while draw < end:
                epoch, within = divmod(draw, self._lengths[source])
                count = min(end - draw, self._lengths[source] - within)
                for piece in step_chunks(self._stream_lengths[source], within, count):
                    laid.append((piece.stream, 0, source, epoch, piece.start, piece.count))
                draw += count
        laid += [(stream, 1, source, -1, first, count) for stream, source, first, count in self._spread(mapped)]
        pieces, offset = [], 0
        for stream, _, source, epoch, first, count in sorted(laid):
            pieces.append(Piece(SourceKey(source, epoch, stream), first, count, offset))
            offset += count
        return pieces

    def _spread(self, mapped: list[tuple[int, int, int]]) -> list[tuple[int, int, int, int]]:
        """A step's map-style draws, in source order, cut into `C` runs as equal as can be:
        run `c` goes after canonical stream `c`, so that stream boundaries, and with them
        the ranks' reading, stay where they would be without map-style sources."""
        streams, total = self._canonical_streams, sum(count for _, _, count in mapped)
        runs, done = [], 0  # run c: the draws [c * total // C, (c + 1) * total // C) of the step's
        for source, first, count in mapped:
            while count:
                stream = ((done + 1) * streams - 1) // total  # the run that holds draw `done`
                take = min(count, (stream + 1) * total // streams - done)
                runs.append((stream, source, first, take))
                first, count, done = first + take, count - take, done + take
        return runs


class MixtureLayout:
    """A rank's batches of a loader epoch of a Mixture of streams from epoch position
    `origin` on: its `j`-th batch is `[r*b, (r+1)*b)` of the step at
    `[origin + j*G, origin + (j+1)*G)` (`MixtureStepOrder.chunks`). The final, partial
    step is, by `mode`: dropped; padded with the epoch's first positions (wrapping), laid
    out after its own items, so every rank gets the same number of batches; or cut short
    (ranks past its end get one batch less)."""

    def __init__(self, order: MixtureStepOrder, origin: int, world_size: int, batch_size: int,
                 mode: TailMode) -> None:
        self._order = order
        self.origin = origin
        self.batch_size = batch_size
        self.global_batch = world_size * batch_size
        self.mode = mode

    def num_batches(self, rank: int) -> int:
        full, partial = divmod(self._order.total - self.origin, self.global_batch)
        if self.mode is TailMode.DROP:
            return full
        if self.mode is TailMode.PAD:
            return full + (partial > 0)
        return full + (partial > rank * self.batch_size)

    def end(self, step: int) -> int:
        """The epoch position after step `step`."""
        return min(self.origin + (step + 1) * self.global_batch, self._order.total)

    def batch(self, rank: int, step: int) -> list[Piece]:
        start = self.origin + step * self.global_batch
        stop = self.end(step)
        layout = self._order.chunks(start, stop)
        missing, offset = start + self.global_batch - stop, stop - start
        while self.mode is TailMode.PAD and missing > 0:
            wrapped = min(missing, self._order.total)
            layout += [piece._replace(offset=piece.offset + offset, padding=True)
                       for piece in self._order.chunks(0, wrapped)]
            missing, offset = missing - wrapped, offset + wrapped
        return window(layout, rank * self.batch_size, (rank + 1) * self.batch_size)

    def owner(self, key: SourceKey, roles: int) -> int:
        """The worker role that reads `key`: canonical stream `c` of every source, and the
        map-style run laid out after it, are read by one role (as for a single stream)."""
        return owner(key.stream, roles)


class MapDraws:
    """The draws of a map-style source, by draw number, read in its source order; with
    `seeding`, draw `d` is fetched under the seed `(seeding.seed, d)` (G4)."""

    def __init__(self, dataset: Dataset, source: int, orders: SourceOrders, seeding: ItemSeeding | None) -> None:
        self._dataset = dataset
        self._source = source
        self._orders = orders
        self._seeding = seeding

    def take(self, start: int, count: int) -> list[Any]:
        draws = torch.arange(start, start + count, dtype=torch.int64)
        sources = torch.full_like(draws, self._source)
        indices = self._orders.indices(sources, draws).tolist()
        if self._seeding is None:
            return [self._dataset[index] for index in indices]
        seeds = derive_seeds(self._seeding.seed, 0, range(start, start + count))
        return self._seeding.each(self._dataset.__getitem__, indices, seeds)


class MixtureSteps:
    """The step source of a Mixture with stream sources (see `streams.steps`), under a
    loader's `seed` and `shuffle` (which order its map-style sources)."""

    kind_name = "Mixture"

    def __init__(self, mixture: Any, sources: Sequence[Any], seed: int, shuffle: bool) -> None:
        self._mixture = mixture  # read live: a reweighting resume replaces its schedule
        self._sources = list(sources)
        self._seed = seed
        self._shuffle = shuffle

    @property
    def canonical_streams(self) -> int | None:
        return self._mixture.canonical_streams

    @property
    def saved_length(self) -> int:
        return self._mixture.length

    @property
    def digest(self) -> int:
        """Identifies every stream source's shards, order and shuffling."""
        return self._combine(lambda stream: stream.digest, lambda name, length: name_key(name))

    @property
    def reader_digest(self) -> int:
        return self._combine(lambda stream: stream.reader_digest, lambda name, length: 0)

    def lengths_digest(self) -> int:
        return self._combine(lambda stream: stream.lengths_digest(), lambda name, length: length)

    def lengths(self) -> list[int]:
        """Every stream source's items (counted by the Mixture when it was made)."""
        return [sum(source.lengths()) for source in self._sources if isinstance(source, ShardedStream)]

    @property
    def epoch_items(self) -> int:
        return self._mixture.length

    def step_order(self, epoch: int, canonical_streams: int) -> MixtureStepOrder:
        """Loader epoch `epoch`'s positions as pieces of readers."""
        mixture = self._mixture
        return MixtureStepOrder(mixture.composition(self._seed, self._shuffle, canonical_streams), self._sources,
                                mixture.lengths, epoch * mixture.length, mixture.length, canonical_streams)

    def step_layout(self, settings: StepSettings) -> MixtureLayout:
        return MixtureLayout(self.step_order(settings.epoch, settings.canonical_streams), settings.origin,
                             settings.world_size, settings.batch_size, settings.mode)

    def canonical_reader(self, epoch: int, key: SourceKey, canonical_streams: int,
                         seeding: ItemSeeding | None = None) -> Any:
        """The reader of `key` (the loader `epoch` plays no part: keys count source-epochs).
        With `seeding`, an item's seed is `(seed, source, source-epoch, position in the
        source's epoch order)` for a stream source, `(seed, source, draw)` for a map-style
        one: fixed by the mixture's arithmetic, whoever reads it (G4)."""
        source = self._sources[key.source]
        own = None if seeding is None else seeding.derived(key.source)
        if key.epoch >= 0:
            return source.canonical_reader(key.epoch, key.stream, canonical_streams, own)
        mixture = self._mixture
        return MapDraws(source, key.source, SourceOrders(mixture.names, mixture.lengths, self._seed, self._shuffle),
                        own)

    def item_reader(self, epoch: int, seeding: ItemSeeding | None = None) -> MixturePositions:
        """With `in_order=False`: the items of loader epoch `epoch`'s positions, position by
        position (`unordered_positions`); each stream source read as one canonical stream,
        an item seeded as `canonical_reader` seeds it with `canonical_streams` 1 (G4)."""
        mixture = self._mixture
        streamed = [isinstance(source, ShardedStream) for source in self._sources]
        return MixturePositions(mixture.composition(self._seed, self._shuffle, 1), mixture.lengths, streamed,
                                epoch * mixture.length,
                                lambda source, source_epoch: self.canonical_reader(
                                    epoch, SourceKey(source, source_epoch, 0), 1, seeding))

    def _combine(self, of_stream: Callable[[ShardedStream], int], of_map: Callable[[str, int], int]) -> int:
        mixture = self._mixture
        return derive_seed(len(self._sources), *(
            of_stream(source) if isinstance(source, ShardedStream) else of_map(name, length)
            for source, name, length in zip(self._sources, mixture.names, mixture.lengths)))
