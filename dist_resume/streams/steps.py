"""A rank's global steps of a `ShardedStream`, read by its workers and joined in the main
process: each worker reads the canonical streams it owns and returns, for every batch of
the rank, its part of it (tagged with the step); the main process joins the parts of a step
in layout order, so a batch does not depend on which worker read what."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from dist_resume.positions.layout import TailMode
from dist_resume.streams.canonical import StepLayout, owner
from dist_resume.streams.sharded import ShardedStream
from dist_resume.streams.stream_reader import CanonicalReader
from dist_resume.workers.roles import Tagged


class Part(NamedTuple):
    """A worker's part of a batch: its items and the offsets where they go (`pieces`), or,
    when it read the whole batch, the batch collated (`collated`)."""

    pieces: tuple[tuple[int, list[Any]], ...]
    collated: Any = None


class StepSettings(NamedTuple):
    """What fixes a rank's batches of an epoch."""

    epoch: int
    rank: int
    world_size: int
    batch_size: int
    mode: TailMode
    canonical_streams: int
    origin: int  # the epoch position the rank's next batch starts at


class StepResume:
    """The workers' readers of a rank's batches from `settings.origin` on."""

    def __init__(self, settings: StepSettings, collate: Callable[[list[Any]], Any]) -> None:
        self._settings = settings
        self._collate = collate

    def __call__(self, stream: ShardedStream, role: int, roles: int) -> StepReader:
        return StepReader(stream, self._settings, role, roles, self._collate)


def step_layout(stream: ShardedStream, settings: StepSettings) -> StepLayout:
    return StepLayout(stream.stream_lengths(settings.canonical_streams), settings.origin, settings.world_size,
                      settings.batch_size, settings.mode)


class StepReader:
    """One worker role's parts of the rank's batches."""

    def __init__(self, stream: ShardedStream, settings: StepSettings, role: int, roles: int,
                 collate: Callable[[list[Any]], Any]) -> None:
        self._stream = stream
        self._settings = settings
        self._role, self._roles = role, roles
        self._collate = collate
        self._readers: dict[int, CanonicalReader] = {}

    def parts(self) -> Iterator[Tagged]:
        """One tagged part per batch of the rank (empty if none of its items is this role's),
        with the epoch position after the batch's step."""
        settings = self._settings
        layout = step_layout(self._stream, settings)
        for step in range(layout.num_batches(settings.rank)):
            batch = layout.batch(settings.rank, step)
            mine = [piece for piece in batch if owner(piece.stream, self._roles) == self._role]
            pieces = tuple((piece.offset, self._reader(piece.stream).take(piece.start, piece.count)) for piece in mine)
            items = sum(piece.count for piece in mine)
            if mine and len(mine) == len(batch):
                part = Part((), self._collate([item for _, values in pieces for item in values]))
            else:
                part = Part(pieces)
            yield Tagged(part, self._role, items, layout.end(step))

    def _reader(self, stream: int) -> CanonicalReader:
        if stream not in self._readers:
            self._readers[stream] = self._stream.canonical_reader(self._settings.epoch, stream,
                                                                  self._settings.canonical_streams)
        return self._readers[stream]


def joined(parts: Sequence[Tagged], collate: Callable[[list[Any]], Any]) -> tuple[Any, int, int]:
    """The batch the parts of one step make, its size and the epoch position after it."""
    steps = {tagged.payload for tagged in parts}
    if len(steps) != 1:  # torch hands out the workers' parts in turn: never expected
        raise RuntimeError(f"ShardedStream: the workers' parts of one batch end at positions {sorted(steps)}")
    size = sum(tagged.items for tagged in parts)
    for tagged in parts:
        if tagged.batch.collated is not None:
            return tagged.batch.collated, size, steps.pop()
    pieces = sorted((piece for tagged in parts for piece in tagged.batch.pieces), key=lambda piece: piece[0])
    return collate([item for _, values in pieces for item in values]), size, steps.pop()


class BatchCollate:
    """A list of items as the loader's `collate_fn` makes a batch of them (one item
    itself without automatic batching, `batch_size=None`)."""

    def __init__(self, collate_fn: Callable[[Any], Any], batched: bool) -> None:
        self._collate_fn = collate_fn
        self._batched = batched

    def __call__(self, items: list[Any]) -> Any:
        return self._collate_fn(items) if self._batched else self._collate_fn(items[0])
