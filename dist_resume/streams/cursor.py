"""IterableDatasets in `ResumableDataLoader`: each worker's stream, recorded as its batches
are yielded to the training loop, and continued from there on resume.

Workers tag every batch with their role and what it advanced (`Tagged`); the main process
records that when it yields the batch, so prefetched batches never count. torch hands
batches to workers in a cycle (skipping exhausted ones), so a resumed loader rotates the
roles (`play_role`) to start the cycle at the role after the last yielded batch (G1).

Two kinds of stream:
- `ShardedStream`: progress is consumed items per shard; a resume at any world size and
  `num_workers` re-partitions what is left (G2).
- any other IterableDataset: per role, the dataset's `state_dict()` every `snapshot_every`
  batches (if it has one) plus the items yielded since; a resume loads the snapshot into
  the worker of that role and skips those items (replays the whole stream without one).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..arguments import checked_int
from ..seeds import derive_seed
from ..state import RankState, ResumeStateError, SavedStates, rank_key
from ..worker_roles import PASS_END, Tagged, is_stateful
from .datapipes import PipeSettings, warn_if_unsplit
from .readers import (RoleInit, ShardResume, Snapshot, SnapshotReader, SnapshotResume, WorkerStream, dataset_snapshot,
                      unwrap)
from .sharded import ShardedStream
from .stream_state import KIND_WORDS, read_meta, role_items, shard_counts
from .stream_state import META as _META
from .stream_state import SHARD_KIND as _SHARD_KIND
from .stream_state import SNAPSHOT_KIND as _SNAPSHOT_KIND

STREAM_KEY = "stream"


class _SnapshotRecords:
    """Per role: the latest snapshot of a yielded batch (or the epoch's start state) and
    the items the role yielded since."""

    kind = _SNAPSHOT_KIND
    elastic = False  # a role's stream cannot move to another world size or worker count

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
        state: dict[str, Any] = {"items": torch.tensor([items for _, items in self._records], dtype=torch.int64)}
        of_iterator = []
        for role, (snapshot, items) in enumerate(self._records):
            if snapshot is None and not items and self._in_process:
                snapshot = self._current()
            of_iterator.append(int(snapshot is not None and snapshot.of_iterator))
            if snapshot is not None:
                state[f"snapshot_{role}"] = snapshot.state
        state["of_iterator"] = torch.tensor(of_iterator, dtype=torch.int64)
        return state

    def load(self, entries: dict[str, Mapping[str, Any]]) -> None:
        ((where, own),) = entries.items()
        # What this process's stream did before no longer tells where the loaded state stands;
        # the passes after it carry what the resumed one ends with.
        self._iterated, self._reader = False, None
        self._carried = [None] * self._roles
        self._unended, self._pass_yielded = set(), False
        items = role_items(own, where, self._roles)
        of_iterator = own["of_iterator"].tolist() if "of_iterator" in own else [0] * len(items)
        self._records = [
            (Snapshot(bool(of_iterator[role]), own[f"snapshot_{role}"]) if f"snapshot_{role}" in own else None, count)
            for role, count in enumerate(items)
        ]
        if not is_stateful(self._dataset) and any(count and snapshot is None for snapshot, count in self._records):
            warnings.warn(
                f"ResumableDataLoader: {type(self._dataset).__name__} has no state_dict/load_state_dict, so each "
                f"worker resumes by replaying its stream and discarding the {sum(items)} items already consumed",
                stacklevel=4,
            )


class _ShardRecords:
    """Items consumed per shard, and the shards known finished, in the current epoch."""

    kind = _SHARD_KIND
    elastic = True
    carry = False  # no state but the counts, which every pass starts from zero

    def __init__(self, stream: ShardedStream) -> None:
        self._stream = stream
        self._consumed = [0] * len(stream.shards)
        self._finished = [0] * len(stream.shards)

    def start_epoch(self) -> None:
        self._consumed = [0] * len(self._stream.shards)
        self._finished = [0] * len(self._stream.shards)

    def resume(self, epoch: int, rank: int, world_size: int) -> ShardResume:
        return ShardResume(epoch, rank, world_size, list(self._consumed), list(self._finished))

    def record(self, tagged: Tagged) -> None:
        taken, finished = tagged.payload
        for shard, count in taken:
            self._consumed[shard] += count
        for shard in finished:
            self._finished[shard] = 1

    def digest(self) -> int:
        return self._stream.digest

    def state(self) -> dict[str, Any]:
        return {
            "consumed": torch.tensor(self._consumed, dtype=torch.int64),
            "finished": torch.tensor(self._finished, dtype=torch.int64),
        }

    def load(self, entries: dict[str, Mapping[str, Any]]) -> None:
        # Each shard is read by one slot at a time, and every rank starts from the same
        # merged counts: the most any rank saw is the shard's count.
        counts = [shard_counts(entry, where, len(self._stream.shards)) for where, entry in entries.items()]
        self._consumed = [max(column) for column in zip(*(consumed for consumed, _ in counts))]
        self._finished = [max(column) for column in zip(*(finished for _, finished in counts))]


class StreamCursor:
    """The main-process side of an IterableDataset: records, state, and the inner loader."""

    def __init__(self, dataset: IterableDataset, num_workers: int, snapshot_every: int, persistent_workers: bool) -> None:
        snapshot_every = checked_int("snapshot_every", snapshot_every, 1)
        self.num_workers = num_workers
        self.roles = max(num_workers, 1)
        if isinstance(dataset, ShardedStream):
            self._records: _SnapshotRecords | _ShardRecords = _ShardRecords(dataset)
        else:
            self._records = _SnapshotRecords(dataset, self.roles, snapshot_every, num_workers == 0,
                                             persistent_workers and num_workers > 0 and is_stateful(dataset))
        self._last_role = -1  # role of the last yielded batch of the epoch, -1 before the first
        self._records.start_epoch()

    @property
    def length(self) -> int:
        """What the loader's state calls the dataset length: the number of shards, or 0."""
        stream = self._records._stream if isinstance(self._records, _ShardRecords) else None
        return len(stream.shards) if stream is not None else 0

    def start_epoch(self) -> None:
        self._records.start_epoch()
        self._last_role = -1

    def loader(self, owner: DataLoader, epoch: int, rank: int, world_size: int, deterministic: bool, seed: int) -> DataLoader:
        """A fresh inner DataLoader that continues every role's stream of `epoch`."""
        collate = owner.collate_fn
        warn_if_unsplit(owner.dataset, self.roles * world_size)
        worker_stream = WorkerStream(
            owner.dataset,
            self._records.resume(epoch, rank, world_size),
            collate,
            owner.batch_size,
            owner.drop_last,
            derive_seed(seed, epoch, rank) if deterministic else None,
            PipeSettings(derive_seed(seed, epoch), rank, world_size),
            report_end=self._records.carry,
        )
        return DataLoader(
            worker_stream,
            batch_size=None,
            num_workers=owner.num_workers,
            collate_fn=unwrap,
            pin_memory=owner.pin_memory,
            timeout=owner.timeout,
            worker_init_fn=RoleInit((self._last_role + 1) % self.roles, owner.worker_init_fn) if owner.num_workers else None,
            multiprocessing_context=owner.multiprocessing_context,
            generator=owner.generator,
            prefetch_factor=owner.prefetch_factor,
            pin_memory_device=owner.pin_memory_device,
        )

    def yielded(self, inner: Iterator[Tagged], sizes) -> Iterator[Any]:
        """The batches of `inner`, recorded as they are handed on; `sizes` gets each batch's size."""
        for tagged in inner:
            if tagged.items == PASS_END:
                self._records.ended(tagged)
                continue
            self._records.record(tagged)
            self._last_role = tagged.role
            sizes.append(tagged.items)
            yield tagged.batch

    def state(self) -> dict[str, Any]:
        meta = [self._records.kind, self.num_workers, self._last_role, self._records.digest()]
        return {_META: torch.tensor(meta, dtype=torch.int64), **self._records.state()}

    def load(self, state_dict: Mapping[str, Any], saved: SavedStates, rank: int, world_size: int) -> RankState:
        """Continue from a loaded state; returns the saved progress this rank continues (its
        own when the layout is unchanged; else a fresh count in the ranks' common epoch)."""
        entries = {saved_rank: _stream_entry(state_dict, saved_rank) for saved_rank in saved.ranks}
        metas = {saved_rank: read_meta(entry, _where(saved_rank)) for saved_rank, entry in entries.items()}
        kind, num_workers, last_role, digest = next(iter(metas.values()))
        for saved_rank, meta in metas.items():
            if (meta.kind, meta.num_workers, meta.digest) != (kind, num_workers, digest):
                raise ResumeStateError(f"{_where(saved_rank)} field {_META!r} disagrees with the other ranks' entries")
        if kind != self._records.kind:
            raise ResumeStateError(f"loader state was saved for {KIND_WORDS[kind]}; this loader reads {KIND_WORDS[self._records.kind]}")
        if digest != self._records.digest():
            raise ResumeStateError("loader state was saved for a ShardedStream with other shards, shuffle, window or seed")
        saved_world_size = saved.any.world_size
        if (saved_world_size, max(num_workers, 1)) == (world_size, self.roles):
            if rank not in saved.ranks:
                saved.require_complete(f"resuming rank {rank}")
            self._records.load({_where(rank): entries[rank]})
            self._last_role = metas[rank].last_role
            return saved.ranks[rank]
        describe = (f"at world size {saved_world_size} with num_workers={num_workers}; this loader has "
                    f"world size {world_size} with num_workers={self.num_workers}")
        if not self._records.elastic:
            raise ResumeStateError(
                f"loader state was saved {describe}: an IterableDataset other than ShardedStream resumes only "
                "with the saved world size and num_workers"
            )
        saved.one_epoch(f"at world size {world_size} with num_workers={self.num_workers}",
                        f"world size {saved_world_size} with num_workers={num_workers}", "world size or num_workers")
        self._records.load({_where(saved_rank): entry for saved_rank, entry in entries.items()})
        self._last_role = -1
        finished = all(state.epoch_finished for state in saved.ranks.values())
        return dataclasses.replace(saved.any, rank=rank, world_size=world_size, batches_consumed=0,
                                   samples_consumed=0, epoch_finished=int(finished))


def _where(rank: int) -> str:
    return f"loader state entry {rank_key(rank)!r} stream"


def _stream_entry(state_dict: Mapping[str, Any], rank: int) -> Mapping[str, Any]:
    entry = state_dict[rank_key(rank)].get(STREAM_KEY)
    if not isinstance(entry, Mapping) or _META not in entry:
        raise ResumeStateError(f"loader state entry {rank_key(rank)!r} has no {STREAM_KEY!r} state")
    return entry
