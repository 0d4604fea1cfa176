"""What the main process records of an IterableDataset's yielded batches (other than a
`ShardedStream`'s, in `step_records`): its snapshots per worker role and the items yielded
since; they turn into a rank's saved stream entry and back."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import IterableDataset

from dist_resume.streams.readers import Snapshot, SnapshotReader, SnapshotResume, dataset_snapshot
from dist_resume.streams.stream_state import ITEMS, OF_ITERATOR, SNAPSHOT_KIND, role_items, snapshot_key
from dist_resume.workers.roles import Tagged, is_stateful


class SnapshotRecords:
    """Per role: the latest snapshot of a yielded batch (or the epoch's start state) and
    the items the role yielded since."""

    kind = SNAPSHOT_KIND
    length = 0  # what the loader's state calls the dataset length

    def __init__(self, dataset: IterableDataset, roles: int, every: int, in_process: bool, carry: bool) -> None:
        self._dataset = dataset
        self._roles = roles
        self._every = every
        # persistent_workers: a worker's dataset copy keeps what its passes changed (under
        # torch's DataLoader), so each role's next pass starts from the state its last
        # completed pass ended with. Workers restart at every iter() here, so the state
        # travels: sent after the role's last batch, loaded into the next pass's worker.
        self.carry = carry
        self._carried: list[Snapshot | None] = [None] * roles
        # A loop that stops after the pass's last batch without asking for its end leaves
        # those reports in flight: the next pass must say it cannot carry them.
        self._unended: set[int] = set()  # roles of this pass whose end was not reported
        self._pass_yielded = False
        # num_workers=0: the stream is this process's, so where a role that yielded nothing
        # yet stands is its current state: that of the pass's iterator (or the dataset) once
        # the loader called the dataset's __iter__, and between passes the dataset's, as the
        # same object may run on after the state is taken. Before its first __iter__ it may
        # have no state yet, and a resume iterates it afresh.
        self._in_process = in_process
        self._iterated = False
        self._reader: SnapshotReader | None = None  # this pass's, in process
        self._records: list[tuple[Any, int]] = []

    def start_epoch(self) -> None:
        # A new epoch iterates the dataset afresh, as torch's DataLoader does: no state is
        # loaded into it but what a persistent worker's copy carries (its own __iter__
        # decides where a new pass starts).
        if self._pass_yielded and self._unended:
            warnings.warn(
                f"ResumableDataLoader: a pass over {type(self._dataset).__name__} was left before its end, so the "
                f"end-of-pass state of workers {sorted(self._unended)} is unknown; their next pass starts from the "
                "state their last completed pass ended with, not from where a persistent worker's copy stands "
                "(iterate each pass to its end to carry it)",
                stacklevel=5,
            )
        self._unended, self._pass_yielded = set(), False
        self._records = [(carried, 0) for carried in self._carried]
        self._reader = None

    def ended(self, tagged: Tagged) -> None:
        """Role `tagged.role` completed its pass, its dataset in state `tagged.payload`."""
        self._carried[tagged.role] = tagged.payload
        self._unended.discard(tagged.role)

    def resume(self, epoch: int, rank: int, world_size: int) -> SnapshotResume:
        if self.carry:
            self._unended, self._pass_yielded = set(range(self._roles)), False
        return SnapshotResume(list(self._records), self._every, self._started if self._in_process else None)

    def _started(self, reader: SnapshotReader) -> None:
        self._iterated, self._reader = True, reader

    def _current(self) -> Snapshot | None:
        if self._reader is not None:
            return self._reader.now()
        return dataset_snapshot(self._dataset) if self._iterated else None

    def record(self, tagged: Tagged) -> None:
        self._pass_yielded = True
        snapshot, items = self._records[tagged.role]
        self._records[tagged.role] = (tagged.payload, 0) if tagged.payload is not None else (snapshot, items + tagged.items)

    def digest(self) -> int:
        return 0

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {ITEMS: torch.tensor([items for _, items in self._records], dtype=torch.int64)}
        of_iterator = []
        for role, (snapshot, items) in enumerate(self._records):
            if snapshot is None and not items and self._in_process:
                snapshot = self._current()
            of_iterator.append(int(snapshot is not None and snapshot.of_iterator))
            if snapshot is not None:
                state[snapshot_key(role)] = snapshot.state
        state[OF_ITERATOR] = torch.tensor(of_iterator, dtype=torch.int64)
        return state

    def accept(self, entries: dict[str, Mapping[str, Any]]) -> Callable[[], None]:
        """Check the one saved entry; return what continues from it."""
        ((where, own),) = entries.items()
        items = role_items(own, where, self._roles)
        of_iterator = own[OF_ITERATOR].tolist() if OF_ITERATOR in own else [0] * len(items)
        records = [
            (Snapshot(bool(of_iterator[role]), own[snapshot_key(role)]) if snapshot_key(role) in own else None, count)
            for role, count in enumerate(items)
        ]

        def adopt() -> None:
            # What this process's stream did before no longer tells where the loaded state
            # stands; the passes after it carry what the resumed one ends with.
            self._iterated, self._reader = False, None
            self._carried = [None] * self._roles
            self._unended, self._pass_yielded = set(), False
            self._records = records
            if not is_stateful(self._dataset) and any(count and snapshot is None for snapshot, count in records):
                warnings.warn(
                    f"ResumableDataLoader: {type(self._dataset).__name__} has no state_dict/load_state_dict, so each "
                    f"worker resumes by replaying its stream and discarding the {sum(items)} items already consumed",
                    stacklevel=4,
                )

        return adopt
