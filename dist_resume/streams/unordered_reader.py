"""The worker side of a `ShardedStream` read with `in_order=False`: one worker role's whole
batches of the pass (`unordered_pass`), read in order from its own run of items."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.streams.steps import item_reader, step_source
from dist_resume.streams.unordered_pass import UnorderedPass
from dist_resume.workers.roles import Tagged


class UnorderedResume:
    """The workers' readers of a rank's batches of `served`, each role from the batches it
    already handed to the training loop (`counts`) on; `seed` and `shuffle` are the
    loader's (which order a Mixture's map-style sources)."""

    def __init__(self, served: UnorderedPass, epoch: int, rank: int, counts: list[int],
                 collate: Callable[[list[Any]], Any], seeding: ItemSeeding | None, seed: int = 0,
                 shuffle: bool = False) -> None:
        self._served = served
        self._seed, self._shuffle = seed, shuffle
        self._epoch = epoch
        self._rank = rank
        self._counts = counts
        self._collate = collate
        self._seeding = seeding

    def __call__(self, dataset: Any, role: int, roles: int) -> UnorderedReader:
        return UnorderedReader(step_source(dataset, self._seed, self._shuffle), self._served, self._epoch, self._rank, role,
                               self._counts[role], self._collate, self._seeding)


class UnorderedReader:
    """One worker role's batches, collated and tagged with the role. With `seeding`, an item's
    user code runs under the seed `item_reader` gives its position (a `ShardedStream`'s: its
    place among the epoch's items read one after another): the same whichever rank or
    worker reads it (G4)."""

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
        # One reader over the epoch's items by position: the role's run is read forward,
        # shard after shard; only a final batch's padding reads the epoch's start.
        reader = item_reader(self._stream, self._epoch, self._seeding)
        try:
            for index in self._served.role_batches(self._rank, self._role)[self._done:]:
                runs, padding = self._served.batch(self._rank, index)
                items = [item for start, stop in runs for item in reader.take(start, stop - start)]
                items += [item for position in padding for item in reader.take(position, 1)]
                if self._seeding is not None:  # in process, the training loop's generators are its own
                    self._seeding.restore()
                yield Tagged(self._collate(items), self._role, len(items), None)
        finally:
            reader.close()
