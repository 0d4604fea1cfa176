"""IterableDatasets in `ResumableDataLoader`: each worker's stream, recorded as its batches
are yielded to the training loop, and continued from there on resume.

Workers tag every batch with their role and what it advanced (`Tagged`); the main process
records that when it yields the batch, so prefetched batches never count. torch hands
batches to workers in a cycle (skipping exhausted ones), so a resumed loader rotates the
roles (`play_role`) to start the cycle at the role after the last yielded batch (G1).

Two kinds of stream:
- `ShardedStream` (and any step source, such as a `Mixture` of streams, see `steps`): each
  worker returns its part of every batch of the rank, and the parts
  of a batch are joined here (`steps`); progress is the global step of the rank's next
  batch, and a resume at any world size and `num_workers` continues the same global
  batches from the step every rank reached (G2, G3). With `in_order=False` the
  workers read whole batches of their own runs of epoch positions instead, handed on as
  they arrive; progress is each role's count of batches (`unordered_records`).
- any other IterableDataset: per role, the dataset's `state_dict()` every `snapshot_every`
  batches (if it has one) plus the items yielded since; a resume loads the snapshot into
  the worker of that role and skips those items (replays the whole stream without one).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from dist_resume.arguments import checked_int
from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.randomness.seeds import derive_seed
from dist_resume.state.fields import RankState, ResumeStateError, rank_key
from dist_resume.state.saved import SavedStates
from dist_resume.streams.datapipes import PipeSettings, warn_if_unsplit
from dist_resume.streams.hf_buffers import check_resumable
from dist_resume.positions.layout import TailMode
from dist_resume.streams.readers import RoleInit, WorkerStream, unwrap
from dist_resume.streams.records import SnapshotRecords
from dist_resume.streams.step_records import StepRecords, StreamSkip
from dist_resume.streams.sharded import ShardedStream
from dist_resume.streams.steps import BatchCollate, StepSettings, joined, step_source
from dist_resume.streams.stream_state import CANONICAL_KIND, KIND_WORDS, META, UNORDERED_KIND, read_meta
from dist_resume.streams.unordered_pass import in_order_position, remaining_after
from dist_resume.streams.unordered_records import UnorderedRecords
from dist_resume.workers.by_value import by_value
from dist_resume.workers.roles import PASS_END, Tagged, is_stateful

STREAM_KEY = "stream"


def stream_cursor(dataset: Any, sampled: bool, *args: Any) -> StreamCursor | None:
    """The cursor of a dataset read as a stream (an IterableDataset, or a step source such
    as a Mixture of streams, which takes no sampler: `sampled`), else None; `args` as for
    `StreamCursor`."""
    if not isinstance(dataset, IterableDataset) and step_source(dataset) is None:
        return None
    if sampled and not isinstance(dataset, IterableDataset):  # torch's DataLoader refuses one for an IterableDataset
        raise ValueError("a Mixture with ShardedStream sources orders its own global batches: ResumableDataLoader "
                         "takes no sampler or batch_sampler for it")
    return StreamCursor(dataset, *args)


class StreamCursor:
    """The main-process side of an IterableDataset: records, state, and the inner loader."""

    def __init__(self, dataset: IterableDataset, num_workers: int, snapshot_every: int, persistent_workers: bool,
                 world_size: int, batch_size: int, in_order: bool = True) -> None:
        snapshot_every = checked_int("snapshot_every", snapshot_every, 1)
        self.num_workers = num_workers
        self.roles = max(num_workers, 1)
        source = self._source = step_source(dataset)
        self._records: SnapshotRecords | StepRecords | UnorderedRecords
        if source is not None and not in_order:
            self._records = UnorderedRecords(source, world_size, batch_size, self.roles)
        elif source is not None:
            self._records = StepRecords(source, world_size * self.roles, world_size, batch_size)
        else:
            check_resumable(dataset)
            self._records = SnapshotRecords(dataset, self.roles, snapshot_every, num_workers == 0,
                                             persistent_workers and num_workers > 0 and is_stateful(dataset))
        self._last_role = -1  # role of the last yielded batch of the epoch, -1 before the first
        self._records.start_epoch()

    @property
    def length(self) -> int:
        """What the loader's state calls the dataset length: the number of shards, or 0."""
        return self._records.length

    def start_epoch(self) -> None:
        self._records.start_epoch()
        self._last_role = -1

    def loader(self, owner: DataLoader, epoch: int, rank: int, world_size: int, deterministic: bool | frozenset[str],
               seed: int) -> DataLoader:
        """A fresh inner DataLoader that continues every role's stream of `epoch`."""
        collate = owner.collate_fn
        warn_if_unsplit(owner.dataset, self.roles * world_size)
        seeding = ItemSeeding(seed, deterministic) if deterministic else None
        if isinstance(self._records, StepRecords):
            self._collate = BatchCollate(collate, owner.batch_size is not None)
            resume = self._records.resume(self._settings(owner, epoch, rank), self._collate, seeding)
        elif isinstance(self._records, UnorderedRecords):
            resume = self._records.resume(epoch, rank, _mode(owner), BatchCollate(collate, owner.batch_size is not None),
                                          seeding, owner.seed, owner.shuffle)
        else:
            resume = self._records.resume(epoch, rank, world_size)
        worker_stream = WorkerStream(
            owner.dataset,
            resume,
            collate,
            owner.batch_size,
            owner.drop_last,
            derive_seed(seed, epoch, rank) if deterministic else None,
            PipeSettings(derive_seed(seed, epoch), rank, world_size),
            report_end=self._records.carry,
        )
        prefetch = owner.prefetch_factor
        if prefetch is not None and isinstance(self._records, StepRecords):
            # A worker sends a part of every batch, not whole batches: `roles` parts ahead
            # each is torch's `prefetch_factor * num_workers` batches ahead, in as many bytes.
            prefetch *= self.roles
        return DataLoader(
            worker_stream,
            batch_size=None,
            num_workers=owner.num_workers,
            collate_fn=by_value(unwrap, owner.num_workers),
            pin_memory=owner.pin_memory,
            timeout=owner.timeout,
            worker_init_fn=RoleInit((self._last_role + 1) % self.roles, owner.worker_init_fn) if owner.num_workers else None,
            multiprocessing_context=owner.multiprocessing_context,
            generator=owner.generator,
            prefetch_factor=prefetch,
            pin_memory_device=owner.pin_memory_device,
            in_order=owner.in_order,
        )

    def _settings(self, owner: DataLoader, epoch: int, rank: int) -> StepSettings:
        return self._records.settings(epoch, rank, _mode(owner), owner.seed, owner.shuffle)

    def batches(self, owner: DataLoader, progress: Any, fresh: bool) -> int:
        """Batches this rank yields in `progress`'s epoch in total (`fresh`: an epoch the
        next `iter()` starts, else the current one, of which `progress.batches` were
        yielded): known for a ShardedStream, else -1."""
        if isinstance(self._records, UnorderedRecords):
            return progress.batches + self._records.remaining(owner.rank, _mode(owner), fresh)
        if not isinstance(self._records, StepRecords):
            return -1
        settings = self._settings(owner, progress.epoch, owner.rank)
        return progress.batches + self._records.num_batches(settings._replace(origin=0) if fresh else settings)

    @property
    def skippable(self) -> bool:
        """Whether `skip` can pass over this stream's batches (a ShardedStream's or a step
        source's, read in either order)."""
        return isinstance(self._records, (StepRecords, UnorderedRecords))

    def holes(self, owner: DataLoader) -> list[int]:
        """This rank's batches of the pass that a skip cannot pass over yet (in flight
        below one handed on, with in_order=False)."""
        if isinstance(self._records, UnorderedRecords):
            return self._records.holes(owner.rank, _mode(owner))
        return []

    def skip(self, owner: DataLoader, epoch: int, rank: int, steps: int) -> StreamSkip:
        """Pass over the next `steps` global steps of `epoch` (see `StepRecords.skip` and
        `UnorderedRecords.skip`)."""
        if isinstance(self._records, UnorderedRecords):
            return self._records.skip(rank, _mode(owner), steps)
        return self._records.skip(self._settings(owner, epoch, rank), steps)

    def yielded(self, inner: Iterator[Tagged], sizes) -> Iterator[Any]:
        """The batches of `inner`, recorded as they are handed on; `sizes` gets each batch's size."""
        if isinstance(self._records, StepRecords):
            yield from self._joined(inner, sizes, self._records)
            return
        for tagged in inner:
            if tagged.items == PASS_END:
                self._records.ended(tagged)
                continue
            self._records.record(tagged)
            self._last_role = tagged.role
            sizes.append(tagged.items)
            yield tagged.batch

    def _joined(self, inner: Iterator[Tagged], sizes, records: StepRecords) -> Iterator[Any]:
        # Every worker returns one part per batch, in turn: a batch is `roles` parts.
        while True:
            parts = list(itertools.islice(inner, self.roles))
            if not parts:
                return
            batch, size, step = joined(parts, self._collate)
            records.record(step)
            sizes.append(size)
            yield batch

    def state(self) -> dict[str, Any]:
        meta = [self._records.kind, self.num_workers, self._last_role, self._records.digest()]
        return {META: torch.tensor(meta, dtype=torch.int64), **self._records.state()}

    def accept(self, state_dict: Mapping[str, Any], saved: SavedStates, rank: int,
               world_size: int) -> tuple[RankState, Callable[[], None]]:
        """Check a loaded state; return the saved progress this rank continues and what
        continues the stream from it. Nothing changes before that is called."""
        entries = {saved_rank: _stream_entry(state_dict, saved_rank) for saved_rank in saved.ranks}
        metas = {saved_rank: read_meta(entry, _where(saved_rank)) for saved_rank, entry in entries.items()}
        kind, num_workers, last_role, digest = next(iter(metas.values()))
        for saved_rank, meta in metas.items():
            if (meta.kind, meta.num_workers, meta.digest) != (kind, num_workers, digest):
                raise ResumeStateError(f"{_where(saved_rank)} field {META!r} disagrees with the other ranks' entries")
        if kind != self._records.kind and {kind, self._records.kind} != {CANONICAL_KIND, UNORDERED_KIND}:
            raise ResumeStateError(f"loader state was saved for {KIND_WORDS[kind]}; this loader reads {KIND_WORDS[self._records.kind]}")
        if digest != self._records.digest():
            raise ResumeStateError(f"{_where(next(iter(metas)))} field {META!r} was saved for a ShardedStream with "
                                   "other shards, shuffle, window or seed")
        if kind in (CANONICAL_KIND, UNORDERED_KIND):
            own, adopt_records = self._accept_steps(entries, saved, rank, kind, max(num_workers, 1))
            return own, self._adopt(adopt_records, -1)
        saved_world_size = saved.any.world_size
        if (saved_world_size, max(num_workers, 1)) == (world_size, self.roles):
            if rank not in saved.ranks:
                saved.require_complete(f"resuming rank {rank}")
            return saved.ranks[rank], self._adopt(self._records.accept({_where(rank): entries[rank]}),
                                                   metas[rank].last_role)
        raise ResumeStateError(
            f"loader state was saved at world size {saved_world_size} with num_workers={num_workers}; this loader "
            f"has world size {world_size} with num_workers={self.num_workers}: an IterableDataset other than "
            "ShardedStream resumes only with the saved world size and num_workers"
        )

    def _accept_steps(self, entries: Mapping[int, Mapping[str, Any]], saved: SavedStates, rank: int, kind: int,
                      roles: int) -> tuple[RankState, Callable[[], None]]:
        """A `ShardedStream`'s state, saved with in_order=True (`kind` CANONICAL_KIND) or
        False, continued in this loader's order: a state of the other order is continued
        from the rest of the epoch it leaves (an in-order loader needs that rest to be an
        epoch position of its order, which is the case at a fresh or finished epoch)."""
        records, mode = self._records, TailMode.of(bool(saved.any.drop_last), bool(saved.any.even_batches))
        if kind == records.kind:
            if isinstance(records, UnorderedRecords):
                return records.accept(entries, _where, saved, rank, roles, mode)
            return records.accept(entries, _where, saved, rank)
        stream = self._source
        if not isinstance(stream, ShardedStream):
            saved_order, other = (True, False) if kind == CANONICAL_KIND else (False, True)
            raise ResumeStateError(
                f"loader state was saved with in_order={saved_order} for a {stream.kind_name} of streams, whose "
                f"stream sources in_order={other} reads in another sequence: resume it with in_order={saved_order}")
        if isinstance(records, UnorderedRecords):
            in_order = StepRecords(stream, records.world_size * self.roles, records.world_size, records.batch_size)
            own, adopt_position = in_order.accept(entries, _where, saved, rank)
            adopt_position()  # of this throw-away record: the position it continues
            runs = remaining_after(in_order.position, stream.stream_lengths(in_order.canonical_streams))
            return dataclasses.replace(own, rank=rank, world_size=records.world_size, batch_size=records.batch_size,
                                       global_batch=records.world_size * records.batch_size), \
                records.continue_in_order(runs)
        unordered = UnorderedRecords(stream, saved.any.world_size, saved.any.batch_size, roles)
        runs = unordered.rest_of_epoch(entries, _where, saved, roles, mode)
        position = in_order_position(runs, stream.stream_lengths(records.canonical_streams))
        if position is None:
            raise ResumeStateError(
                "loader state was saved with in_order=False after batches of a ShardedStream were handed on out of "
                "the in-order sequence, whose rest an in_order=True loader cannot continue: resume this epoch with "
                "in_order=False (in_order=True can take over at the next epoch)")
        return records.continue_at(position, saved, rank)

    def _adopt(self, adopt_records: Callable[[], None], last_role: int) -> Callable[[], None]:
        def adopt() -> None:
            adopt_records()
            self._last_role = last_role

        return adopt


def _mode(owner: DataLoader) -> TailMode:
    return TailMode.of(owner.drop_last, getattr(owner, "even_batches", True))


def _where(rank: int) -> str:
    return f"loader state entry {rank_key(rank)!r} stream"


def _stream_entry(state_dict: Mapping[str, Any], rank: int) -> Mapping[str, Any]:
    entry = state_dict[rank_key(rank)].get(STREAM_KEY)
    if not isinstance(entry, Mapping) or META not in entry:
        raise ResumeStateError(f"loader state entry {rank_key(rank)!r} has no {STREAM_KEY!r} state")
    return entry
