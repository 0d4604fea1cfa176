"""The worker side of a `ShardedStream` read with `in_order=False`: one worker role's whole
batches of the pass (`unordered_pass`), read in order from its own run of items."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.streams.steps import step_source
from dist_resume.streams.unordered_pass import UnorderedPass
from dist_resume.workers.roles import Tagged


class UnorderedResume:
    """The workers' readers of a rank's batches of `served`, each role from the batches it
    already handed to the training loop (`counts`) on."""

    def __init__(self, served: UnorderedPass, epoch: int, rank: int, counts: list[int],
                 collate: Callable[[list[Any]], Any], seeding: ItemSeeding | None) -> None:
        self._served = served
        self._epoch = epoch
        self._rank = rank
        self._counts = counts
        self._collate = collate
        self._seeding = seeding

    def __call__(self, dataset: Any, role: int, roles: int) -> UnorderedReader:
        return UnorderedReader(step_source(dataset), self._served, self._epoch, self._rank, role,
                               self._counts[role], self._collate, self._seeding)


class UnorderedReader:
    """One worker role's batches, collated and tagged with the role. With `seeding`, an item's
    `transform` runs under the seed of its place among the epoch's items read one after
    another (the pass's positions): the same whichever rank or worker reads it (G4)."""

    def __init__(self, stream: Any, served: UnorderedPass, epoch: int, rank: int, role: int, done: int,
                 collate: Callable[[list[Any]], Any], seeding: ItemSeeding | None) -> None:
        self._stream = stream
        self._served = served
        self._epoch = epoch
        self._rank = rank
        self._role = role
        self._done = done
        self._collate = collate
        self._seeding = seeding

    def parts(self) -> Iterator[Tagged]:
        # One reader over the epoch's items (a single canonical stream): the role's run is
        # read forward, shard after shard; only a final batch's padding reads the epoch's start.
        reader = self._stream.canonical_reader(self._epoch, 0, 1, self._seeding)
        try:
            for index in self._served.role_batches(self._rank, self._role)[self._done:]:
                runs, padding = self._served.batch(self._rank, index)
                items = [item for start, stop in runs for item in reader.take(start, stop - start)]
                items += [item for position in padding for item in reader.take(position, 1)]
                yield Tagged(self._collate(items), self._role, len(items), None)
        finally:
            reader.close()
