"""A rank's global steps of a `ShardedStream` (or of another *step source*), read by its
workers and joined in the main process: each worker reads the canonical streams it owns and
returns, for every batch of the rank, its part of it (tagged with the step); the main
process joins the parts of a step in layout order, so a batch does not depend on which
worker read what.

A step source is a `ShardedStream`, or what a dataset's `step_source(seed, shuffle)`
returns (a `Mixture` with stream sources): an object with `kind_name` (what errors call
it), `canonical_streams` (int or None), `saved_length` (the dataset length its loader
state records), `epoch_items` (positions per epoch), `digest`, `reader_digest` (and,
optionally, `reader_change(saved digest)`: what differs, for a refusal to name),
`lengths_digest()`, `lengths()` (counts what it must, once, before workers copy it),
`step_layout(settings)` (the rank's batches, as `canonical.StepLayout` gives them: pieces
whose `stream` is a reader key, and `owner(key, roles)`) and `canonical_reader(epoch, key,
C, seeding)` (a reader whose `take(start, count)` returns items of the key a piece names,
per-item user code run under each item's seed from `seeding`, G4); read with
`in_order=False`, also `item_reader(epoch, seeding)`: a reader whose `take(start, count)`
returns the items at epoch positions `[start, start + count)` (see `item_reader`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from dist_resume.positions.layout import TailMode
from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.streams.canonical import StepLayout
from dist_resume.streams.sharded import ShardedStream
from dist_resume.streams.stream_reader import CanonicalReader
from dist_resume.workers.roles import Tagged


class Part(NamedTuple):
    """A worker's part of a batch: its items and the offsets where they go (`pieces`); or
    the batch collated, when it read it all (`collated`); or, when the collate joins parts
    (`BatchCollate`), its `collate_part` of its items (`collated`) and the rows of the
    batch they are (`rows`)."""

    pieces: tuple[tuple[int, list[Any]], ...]
    collated: Any = None
    rows: tuple[int, ...] | None = None


class StepSettings(NamedTuple):
    """What fixes a rank's batches of an epoch."""

    epoch: int
    rank: int
    world_size: int
    batch_size: int
    mode: TailMode
    canonical_streams: int
    origin: int  # the epoch position the rank's next batch starts at
    seed: int = 0  # the loader's seed and shuffle: the order of a Mixture's map-style sources
    shuffle: bool = False


def step_source(dataset: Any, seed: int = 0, shuffle: bool = False) -> Any:
    """What reads `dataset` by global steps under a loader's `seed` and `shuffle` (see the
    module docstring): the `ShardedStream` itself, what `dataset.step_source(seed, shuffle)`
    returns, or None if `dataset` is read otherwise."""
    if isinstance(dataset, ShardedStream):
        return dataset
    make = getattr(dataset, "step_source", None)
    return make(seed, shuffle) if callable(make) else None


class StepResume:
    """The workers' readers of a rank's batches from `settings.origin` on (with `seeding`,
    per-item randomness seeded, G4)."""

    def __init__(self, settings: StepSettings, collate: Callable[[list[Any]], Any],
                 seeding: ItemSeeding | None = None) -> None:
        self._settings = settings
        self._collate = collate
        self._seeding = seeding

    def __call__(self, dataset: Any, role: int, roles: int) -> StepReader:
        source = step_source(dataset, self._settings.seed, self._settings.shuffle)
        return StepReader(source, self._settings, role, roles, self._collate, self._seeding)


def step_layout(stream: Any, settings: StepSettings) -> Any:
    """The rank's batches of an epoch (`canonical.StepLayout`, or what another step source's
    `step_layout(settings)` returns: the same `num_batches`, `end`, `batch` and `owner`)."""
    if not isinstance(stream, ShardedStream):
        return stream.step_layout(settings)
    return StepLayout(stream.stream_lengths(settings.canonical_streams), settings.origin, settings.world_size,
                      settings.batch_size, settings.mode)


def item_reader(stream: Any, epoch: int, seeding: ItemSeeding | None) -> Any:
    """What reads an epoch's items by position with `in_order=False` (`unordered_pass`): a
    `ShardedStream`'s items one after another in the epoch's shard order (one canonical
    stream), or what another step source's `item_reader(epoch, seeding)` returns."""
    if isinstance(stream, ShardedStream):
        return stream.canonical_reader(epoch, 0, 1, seeding)
    return stream.item_reader(epoch, seeding)


def epoch_items(stream: Any) -> int:
    """Positions in an epoch of a step source."""
    return sum(stream.lengths()) if isinstance(stream, ShardedStream) else stream.epoch_items


class StepReader:
    """One worker role's parts of the rank's batches."""

    def __init__(self, stream: Any, settings: StepSettings, role: int, roles: int,
                 collate: Callable[[list[Any]], Any], seeding: ItemSeeding | None = None) -> None:
        self._stream = stream
        self._settings = settings
        self._role, self._roles = role, roles
        self._collate = collate
        self._seeding = seeding
        self._readers: dict[Any, CanonicalReader] = {}

    def parts(self) -> Iterator[Tagged]:
        """One tagged part per batch of the rank (empty if none of its items is this role's),
        with the epoch position after the batch's step."""
        settings = self._settings
        layout = step_layout(self._stream, settings)
        owner, role, roles, rank, seeding = layout.owner, self._role, self._roles, settings.rank, self._seeding
        collate_part = getattr(self._collate, "collate_part", None)  # a collate that joins parts: workers make theirs
        for step in range(layout.num_batches(rank)):
            batch = layout.batch(rank, step)
            # A sole role (num_workers <= 1) reads every piece: no owner to ask.
            mine = batch if roles == 1 else [piece for piece in batch if owner(piece.stream, roles) == role]
            pieces = tuple([(piece.offset, self._reader(piece.stream).take(piece.start, piece.count))
                            for piece in mine])
            if seeding is not None:  # in process, the training loop's generators are its own
                seeding.restore()
            items = sum([piece.count for piece in mine])
            if mine and (len(mine) == len(batch) or collate_part is not None):
                values = pieces[0][1] if len(pieces) == 1 else [item for _, values in pieces for item in values]
                rows = None if len(mine) == len(batch) else tuple(
                    row for piece in mine for row in range(piece.offset, piece.offset + piece.count))
                part = Part((), self._collate(values) if rows is None else collate_part(values), rows)
            else:
                part = Part(pieces)
            yield Tagged(part, self._role, items, layout.end(step))

    def _reader(self, stream: Any) -> CanonicalReader:
        if stream not in self._readers:
            # A key that `supersedes` others (a later source-epoch of a Mixture's stream)
            # retires their readers and the shards they hold open; one needed again reopens.
            supersedes = getattr(stream, "supersedes", None)
            if supersedes is not None:
                for old in [key for key in self._readers if supersedes(key)]:
                    retired = self._readers.pop(old)
                    if callable(getattr(retired, "close", None)):
                        retired.close()
            self._readers[stream] = self._stream.canonical_reader(self._settings.epoch, stream,
                                                                  self._settings.canonical_streams, self._seeding)
        return self._readers[stream]


def joined(parts: Sequence[Tagged], collate: Callable[[list[Any]], Any]) -> tuple[Any, int, int]:
    """The batch the parts of one step make, its size and the epoch position after it."""
    if len(parts) == 1 and parts[0].batch.collated is not None:  # one role read it all: num_workers <= 1
        return parts[0].batch.collated, parts[0].items, parts[0].payload
    steps = {tagged.payload for tagged in parts}
    if len(steps) != 1:  # torch hands out the workers' parts in turn: never expected
        raise RuntimeError(f"ShardedStream: the workers' parts of one batch end at positions {sorted(steps)}")
    size = sum(tagged.items for tagged in parts)
    collated = [tagged.batch for tagged in parts if tagged.batch.collated is not None]
    if len(collated) == 1 and collated[0].rows is None:
        return collated[0].collated, size, steps.pop()
    if collated:
        return collate.join_parts([(part.rows, part.collated) for part in collated]), size, steps.pop()
    pieces = sorted((piece for tagged in parts for piece in tagged.batch.pieces), key=lambda piece: piece[0])
    return collate([item for _, values in pieces for item in values]), size, steps.pop()


class BatchCollate:
    """A list of items as the loader's `collate_fn` makes a batch of them (one item
    itself without automatic batching, `batch_size=None`); with `collate_part` and
    `join_parts` when the batches are of several items and `collate_fn` has both
    (`PackedCollate`'s), so that each worker makes its own part of a batch and the main
    process joins the parts into the batch `collate_fn` makes of all their items."""

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool) -> None:
        self._collate_fn = collate_fn
        self._batched = batched
        part, join = (getattr(collate_fn, name, None) for name in ("collate_part", "join_parts"))
        if batched and callable(part) and callable(join):
            self.collate_part, self.join_parts = part, join

    def __call__(self, items: list[Any]) -> Any:
        return self._collate_fn(items) if self._batched else self._collate_fn(items[0])
