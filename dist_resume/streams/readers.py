"""The worker side of a stream in `ResumableDataLoader`: the reader of one role's items from
its saved place, and the inner loader's dataset that batches and tags them."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from torch.utils.data import IterableDataset, get_worker_info

from dist_resume.randomness.seeds import SampleSeeder, derive_seed
from dist_resume.streams.datapipes import PipeSettings, configure
from dist_resume.streams.steps import StepReader
from dist_resume.streams.unordered_reader import UnorderedReader
from dist_resume.workers.roles import PASS_END, Tagged, is_stateful, play_role, state_now


def drawn(iterator: Iterator[Any]) -> Iterator[Any]:
    # Only next() from here on: an iterator's __iter__ may restart it (one that is its own
    # dataset), and items are never compared with anything (numpy arrays cannot be).
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        yield item


class Snapshot(NamedTuple):
    """A role's saved state: of the iterator `iter(dataset)` returned when that is
    stateful (loaded after `iter()`, as torchdata does), else of the dataset (loaded before)."""

    of_iterator: bool
    state: Any


def dataset_snapshot(dataset: IterableDataset) -> Snapshot | None:
    """The dataset's own state now, which a new pass over it starts from (None: it has none)."""
    return Snapshot(False, state_now(dataset)) if is_stateful(dataset) else None


class SnapshotReader:
    """A role's stream of any IterableDataset, from its snapshot and items to skip."""

    def __init__(self, dataset: IterableDataset, snapshot: Snapshot | None, skip: int, every: int) -> None:
        self._batches = 0
        if snapshot is not None and not snapshot.of_iterator:
            dataset.load_state_dict(snapshot.state)
        iterator = iter(dataset)
        self._of_iterator = is_stateful(iterator)
        self._source = iterator if self._of_iterator else dataset
        self._every = every if is_stateful(self._source) else 0
        if snapshot is not None and snapshot.of_iterator:
            iterator.load_state_dict(snapshot.state)
        self.items = drawn(iterator)
        for _ in itertools.islice(self.items, skip):
            pass

    def now(self) -> Snapshot | None:
        """The stream's state now (None: it has none)."""
        return Snapshot(self._of_iterator, state_now(self._source)) if is_stateful(self._source) else None

    def payload(self) -> Snapshot | None:
        """The stream's state after this batch, every `every` batches; else None."""
        self._batches += 1
        if self._every and self._batches % self._every == 0:
            return self.now()
        return None


class WorkerStream(IterableDataset):
    """The inner DataLoader's dataset: a role's batches, collated and tagged, in a worker."""

    def __init__(self, dataset, resume: Callable[[IterableDataset, int, int], Any], collate_fn, batch_size: int | None,
                 drop_last: bool, seed: int | None, pipe: PipeSettings, report_end: bool) -> None:
        self.dataset = dataset
        self._report_end = report_end  # send the dataset's state after a role's last batch
        self._resume = resume
        self._pipe = pipe
        self._collate = collate_fn
        self._batch_size = batch_size
        self._drop_last = drop_last
        self._seed = seed  # None: leave the workers' random generators alone

    def __iter__(self) -> Iterator[Tagged]:
        # The stream starts when the inner loader's iterator is made, as torch's DataLoader
        # calls iter(dataset) then: a state taken right after iter() holds the dataset's.
        info = get_worker_info()
        role, roles = (info.id, info.num_workers) if info is not None else (0, 1)
        # A worker's generators are its own; in process they are the training loop's, which
        # the stream draws from as under torch's DataLoader (never reseeded here).
        if self._seed is not None and info is not None:
            SampleSeeder().seed(derive_seed(self._seed, role))
        configure(self.dataset, self._pipe, role, roles)
        return self._batches(self._resume(self.dataset, role, roles), role)

    def _batches(self, reader: SnapshotReader | StepReader | UnorderedReader, role: int) -> Iterator[Tagged]:
        if isinstance(reader, (StepReader, UnorderedReader)):
            yield from reader.parts()
            return
        size = self._batch_size or 1
        while True:
            items = list(itertools.islice(reader.items, size))
            if not items or (len(items) < size and self._drop_last):
                if self._report_end:
                    yield Tagged(None, role, PASS_END, dataset_snapshot(self.dataset))
                return
            batch = self._collate(items) if self._batch_size is not None else self._collate(items[0])
            yield Tagged(batch, role, len(items), reader.payload())


class RoleInit:
    """worker_init_fn: take the role first, then run the user's worker_init_fn with it."""

    def __init__(self, shift: int, user_fn: Callable[[int], None] | None) -> None:
        self._shift = shift
        self._user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        role = play_role(self._shift, get_worker_info().dataset.dataset)
        if self._user_fn is not None:
            self._user_fn(role)


class SnapshotResume:
    def __init__(self, records: list[tuple[Any, int]], every: int,
                 started: Callable[[SnapshotReader], None] | None) -> None:
        self._records = records
        self._every = every
        self._started = started  # in process: given the reader once the dataset's __iter__ ran

    def __call__(self, dataset: IterableDataset, role: int, roles: int) -> SnapshotReader:
        snapshot, skip = self._records[role]
        reader = SnapshotReader(dataset, snapshot, skip, self._every)
        if self._started is not None:
            self._started(reader)
        return reader


def unwrap(batch: Any) -> Any:
    return batch
