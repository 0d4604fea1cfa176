"""`ResumableDataLoader`: torch's DataLoader that knows where it is, and resumes there."""

from __future__ import annotations

import collections
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import DataLoader, Dataset, IterableDataset

from .dataset_order import definition_digest, position_order, resume_definition, save_definition
from .dataset_state import DATASET_KEY, DatasetStates, TaggingCollate
from .elastic_plan import Plan, rank_positions
from .fetch import BatchRequest, SeededDataset, SingleSample
from .layout import Layout, TailMode
from .remap import resume_rank
from .state import (
    FORMAT_VERSION,
    Identity,
    RankState,
    Sampling,
    decode,
    encode,
    plan_digest,
    rank_key,
)
from .streams.cursor import STREAM_KEY, StreamCursor
from .streams.sharded import ShardedStream
from .worker_roles import is_stateful

# Positions mapped to indices per vectorized call: large enough that the per-call
# cost of tensor operations vanishes, small enough that the first batch is quick.
_POSITIONS_PER_CHUNK = 16384


class _RequestSampler:
    """The batch sampler of the inner DataLoader: each `iter()` asks the loader for the
    requests of its current position, so persistent workers follow resumes."""

    def __init__(self, loader: ResumableDataLoader) -> None:
        self._loader = loader

    def __iter__(self) -> Iterator[BatchRequest]:
        return self._loader._requests()

    def __len__(self) -> int:
        return len(self._loader)


class _Progress:
    """Where this rank is in its current epoch."""

    def __init__(self, epoch: int, plan: Plan, batches: int = 0, samples: int = 0, finished: bool = False) -> None:
        self.epoch = epoch
        self.plan = plan
        self.batches = batches
        self.samples = samples
        self.finished = finished
        # Set by set_epoch: the next iter() serves this epoch even if it is finished.
        self.chosen = False


class ResumableDataLoader(DataLoader):
    """A drop-in `torch.utils.data.DataLoader` that can stop anywhere and resume on the
    exact next sample, at the same or another world size (GUARANTEES G1-G6).

    Takes every argument of `DataLoader`, with the same meaning, plus:

    - `seed`: the epoch order (with `shuffle=True`) and per-sample randomness are drawn
      from `(seed, epoch)` and `(seed, epoch, position)`; default 0, or the initial seed
      of `generator` when one is given.
    - `rank`, `world_size`, `process_group`: the data-parallel shard. By default from
      `torch.distributed` when it is initialized (`process_group` may be a group or a 1-D
      `DeviceMesh`), else rank 0 of 1. `batch_size` is per rank.
    - `even_batches` (with `drop_last=False`): pad the final global batch from the start
      of the epoch so every rank gets the same number of batches (default), or not.
    - `deterministic_transforms`: seed `torch`, `random` and `numpy` before each sample
      (for an IterableDataset: at the start of each worker's stream, from `(seed, epoch,
      rank, worker)`).
    - `snapshot_every` (IterableDataset with `state_dict`/`load_state_dict`): each worker
      saves its dataset's state after every `snapshot_every`-th batch it produces; a
      resume loads the last snapshot of a yielded batch and replays the fewer than
      `snapshot_every` batches since (exact at any step; 1: no replay, a state round-trip
      per batch).

    An `IterableDataset` is resumed per worker (same world size and `num_workers`), or, for
    a `ShardedStream`, at any world size and `num_workers` (see `dist_resume.streams.cursor`).

    The loader is a cursor over its epoch: a new `iter()` continues where the last
    consumed batch left off. After an epoch is exhausted the next `iter()` starts the
    next epoch unless `set_epoch` chose one. `load_state_dict` takes effect at the next
    `iter()`; an iterator that was running stops with an error rather than mix states.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler=None,
        batch_sampler=None,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        process_group=None,
        even_batches: bool = True,
        deterministic_transforms: bool = True,
        snapshot_every: int = 16,
    ) -> None:
        if not in_order:
            raise ValueError(
                "in_order=False lets workers return batches out of order, so 'consumed' would not be "
                "a prefix of the epoch; ResumableDataLoader needs in_order=True to resume exactly"
            )
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
        )
        if seed is None:
            seed = generator.initial_seed() if generator is not None else 0
        if not 0 <= seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        self.seed = seed
        self._stream = StreamCursor(dataset, num_workers, snapshot_every) if isinstance(dataset, IterableDataset) else None
        self.shuffle = dataset.shuffle if isinstance(dataset, ShardedStream) else bool(shuffle)
        self.even_batches = even_batches
        self.deterministic_transforms = deterministic_transforms
        self.rank, self.world_size = _data_parallel_shard(rank, world_size, process_group)
        self._user_sampler = batch_sampler if batch_sampler is not None else sampler
        if self._stream is not None:
            self._sampling = Sampling.STREAM
        elif batch_sampler is not None:
            self._sampling = Sampling.BATCH_SAMPLER
        elif sampler is not None:
            self._sampling = Sampling.SAMPLER
            if self.world_size > 1:
                warnings.warn(
                    "ResumableDataLoader: with a custom sampler the loader does not shard over ranks; "
                    "the sampler must (for example DistributedSampler)",
                    stacklevel=2,
                )
        else:
            self._sampling = Sampling.EPOCH_ORDER
        self._rank_batch_size = batch_size if batch_size is not None else 1
        self._mode = TailMode.of(drop_last, even_batches)
        self._dataset_length = self._stream.length if self._stream is not None else len(dataset)
        self._progress = _Progress(0, Plan(self._dataset_length, self._mode, 0))
        # The elastic plan this job loaded: fixed until the next load, so that every rank
        # saves the same replicated value (DCP keeps one copy of it), whatever its epoch.
        self._plan_values: list[int] = []
        self._sampler_snapshot: Any = None  # a stateful user sampler's state at the epoch's start
        self._generation = 0
        self._sizes: collections.deque[int] = collections.deque()
        self._inner: DataLoader | None = None
        stateful_dataset = self._stream is None and is_stateful(dataset)
        self._dataset_states = DatasetStates(dataset, num_workers) if stateful_dataset else None

    # -- what the loader is -------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the loader is in (the one the next `iter()` continues or starts)."""
        return self._next_progress().epoch

    @property
    def identity(self) -> Identity:
        return Identity(self._dataset_length, self.seed, self.shuffle, self.drop_last, self.even_batches, self._sampling,
                        definition_digest(self.dataset))

    def _layout(self, progress: _Progress) -> Layout:
        return Layout(progress.plan.length, self.world_size, self._rank_batch_size, self._mode)

    def __len__(self) -> int:
        """Batches this rank yields in the epoch the next `iter()` serves (in total)."""
        progress = self._next_progress()
        if self._sampling is Sampling.EPOCH_ORDER:
            return self._layout(progress).num_batches(self.rank)
        return super().__len__()

    def padding_positions(self, epoch: int | None = None) -> list[int]:
        """Positions of `epoch`'s order (default: the current) that this rank's final batch
        repeats as padding (G2, `drop_last=False, even_batches=True`); [] if none."""
        progress = self._next_progress()
        if epoch is not None and epoch != progress.epoch:
            progress = _Progress(epoch, self._plan_for(epoch))
        if self._sampling is not Sampling.EPOCH_ORDER or self._mode is not TailMode.PAD:
            return []
        layout = self._layout(progress)
        last = layout.num_batches(self.rank) - 1
        if last < 0:
            return []
        batch = layout.batch(self.rank, last)
        return [(batch.padding_start + i) % self._dataset_length for i in range(batch.padding)]

    # -- epochs -------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Serve `epoch` at the next `iter()` (like `DistributedSampler.set_epoch`). The
        epoch in progress keeps its position, so a resumed loop may call it unconditionally."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        progress = self._progress
        if epoch == progress.epoch:
            if progress.finished:
                warnings.warn(
                    f"ResumableDataLoader.set_epoch({epoch}): epoch {epoch} is already finished, "
                    "iterating it yields no batches",
                    stacklevel=2,
                )
            progress.chosen = True
            return
        if progress.batches and not progress.finished:
            warnings.warn(
                f"ResumableDataLoader.set_epoch({epoch}) abandons epoch {progress.epoch} after "
                f"{progress.batches} batches; its remaining samples are skipped",
                stacklevel=2,
            )
        self._switch_epoch(epoch)
        self._progress.chosen = True

    def _plan_for(self, epoch: int) -> Plan:
        values = self._plan_values
        if values and values[0] == epoch:
            return Plan.decode(values, self._dataset_length, self._mode, epoch)
        return Plan(self._dataset_length, self._mode, epoch)

    def _switch_epoch(self, epoch: int) -> None:
        self._progress = _Progress(epoch, self._plan_for(epoch))
        self._sampler_snapshot = None
        if self._stream is not None:
            self._stream.start_epoch()
        self._generation += 1

    def _next_progress(self) -> _Progress:
        progress = self._progress
        if progress.finished and not progress.chosen:
            return _Progress(progress.epoch + 1, self._plan_for(progress.epoch + 1))
        return progress

    # -- iteration ----------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        progress = self._progress
        if progress.finished and not progress.chosen:
            self._switch_epoch(progress.epoch + 1)
        self._progress.chosen = False
        self._generation += 1
        self._sizes = collections.deque()
        if self._stream is not None:
            inner = self._stream.loader(self, self._progress.epoch, self.rank, self.world_size,
                                        self.deterministic_transforms, self.seed)
            return _ResumingIterator(self, self._stream.yielded(iter(inner), self._sizes), self._generation)
        inner = iter(self._inner_loader())
        if self._dataset_states is not None:
            inner = self._dataset_states.yielded(inner)
        return _ResumingIterator(self, inner, self._generation)

    def _inner_loader(self) -> DataLoader:
        if self._inner is None:
            collate = self.collate_fn if self._auto_collation else SingleSample(self.collate_fn)
            if self._dataset_states is not None:
                collate = TaggingCollate(collate)
            self._inner = DataLoader(
                SeededDataset(self.dataset, self.seed, self.deterministic_transforms),
                batch_sampler=_RequestSampler(self),
                num_workers=self.num_workers,
                collate_fn=collate,
                pin_memory=self.pin_memory,
                timeout=self.timeout,
                worker_init_fn=self.worker_init_fn,
                multiprocessing_context=self.multiprocessing_context,
                generator=self.generator,
                prefetch_factor=self.prefetch_factor,
                persistent_workers=self.persistent_workers,
                pin_memory_device=self.pin_memory_device,
            )
        return self._inner

    def _requests(self) -> Iterator[BatchRequest]:
        # Read the position now: the generator body only runs when the first batch is drawn.
        progress = self._progress
        start = (progress.batches, progress.samples)
        if self._sampling is Sampling.EPOCH_ORDER:
            requests = self._epoch_order_requests(progress.epoch, progress.plan, start[0])
        else:
            requests = self._user_sampler_requests(progress.epoch, *start)
        return _recording_sizes(requests, self._sizes, start[0], self._dataset_states)

    def _epoch_order_requests(self, epoch: int, plan: Plan, first_batch: int) -> Iterator[BatchRequest]:
        layout = Layout(plan.length, self.world_size, self._rank_batch_size, self._mode)
        order = position_order(self.dataset, self._dataset_length, self.seed, epoch, self.shuffle)
        total = layout.num_batches(self.rank)
        per_chunk = max(1, _POSITIONS_PER_CHUNK // layout.batch_size)
        for first in range(first_batch, total, per_chunk):
            positions, sizes = rank_positions(plan, layout, self.rank, first, min(total, first + per_chunk))
            indices = order.indices(positions)
            positions_list = positions.tolist()
            offset = 0
            for size in sizes:
                yield BatchRequest(epoch, positions_list[offset : offset + size], indices[offset : offset + size])
                offset += size

    def _user_sampler_requests(self, epoch: int, first_batch: int, first_sample: int) -> Iterator[BatchRequest]:
        sampler = self._user_sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        stateful = callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None))
        if stateful:
            if self._sampler_snapshot is None:
                self._sampler_snapshot = sampler.state_dict()
            else:
                sampler.load_state_dict(self._sampler_snapshot)
        # Resume by replaying the sampler's indices (no data is fetched) up to the
        # consumed count: a sampler's stream cannot be entered in the middle.
        position = 0
        if self._sampling is Sampling.BATCH_SAMPLER:
            for index, batch in enumerate(sampler):
                indices = list(batch)
                if index >= first_batch:
                    yield BatchRequest(epoch, list(range(position, position + len(indices))), indices)
                position += len(indices)
            return
        pending: list[int] = []
        for index in sampler:
            if position >= first_sample:
                pending.append(index)
                if len(pending) == self._rank_batch_size:
                    yield BatchRequest(epoch, list(range(position - len(pending) + 1, position + 1)), pending)
                    pending = []
            position += 1
        if pending and not self.drop_last:
            yield BatchRequest(epoch, list(range(position - len(pending), position)), pending)

    def _consumed(self) -> None:
        """The current iterator handed one more batch to the training loop."""
        progress = self._progress
        progress.batches += 1
        progress.samples += self._sizes.popleft()
        if self._sampling is Sampling.EPOCH_ORDER and progress.batches == self._layout(progress).num_batches(self.rank):
            progress.finished = True

    def _exhausted(self) -> None:
        self._progress.finished = True

    # -- state --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: int64 tensors under a key unique to the rank (G5)."""
        progress = self._progress
        state = RankState(
            version=FORMAT_VERSION,
            dataset_length=self._dataset_length,
            seed=self.seed,
            shuffle=int(self.shuffle),
            drop_last=int(self.drop_last),
            even_batches=int(self.even_batches),
            sampling=int(self._sampling),
            epoch=progress.epoch,
            world_size=self.world_size,
            rank=self.rank,
            batch_size=self._rank_batch_size,
            global_batch=self.world_size * self._rank_batch_size,
            batches_consumed=progress.batches,
            samples_consumed=progress.samples,
            epoch_finished=int(progress.finished),
            plan_digest=plan_digest(self._plan_values),
            dataset_digest=definition_digest(self.dataset),
        )
        sampler_state = None
        if callable(getattr(self._user_sampler, "state_dict", None)):
            sampler_state = self._sampler_snapshot if self._sampler_snapshot is not None else self._user_sampler.state_dict()
        state_dict = encode(state, self._plan_values, sampler_state)
        save_definition(self.dataset, state_dict)
        if self._stream is not None:
            state_dict[rank_key(self.rank)][STREAM_KEY] = self._stream.state()
        if self._dataset_states is not None:
            state_dict[rank_key(self.rank)][DATASET_KEY] = self._dataset_states.state()
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a saved state at the next `iter()` (G1, G6). `state_dict` holds this
        rank's entry, or the entries of every saved rank (needed when the world size or the
        batch size changed: the remaining samples are then re-partitioned, G2, G3)."""
        saved = decode(state_dict)
        adopt_definition = resume_definition(self.dataset, state_dict, saved)
        saved.check_identity(self.identity)
        adopt_definition()
        if self._stream is not None:
            own = self._stream.load(state_dict, saved, self.rank, self.world_size)
            self._progress = _Progress(own.epoch, self._plan_for(own.epoch), own.batches_consumed,
                                       own.samples_consumed, bool(own.epoch_finished))
            self._generation += 1
            return
        resume = resume_rank(saved, self.world_size, self._rank_batch_size, self.rank)
        if self._dataset_states is not None:
            entry = state_dict.get(rank_key(self.rank), {}).get(DATASET_KEY)
            self._dataset_states.load(entry, saved.any.world_size, self.world_size)
        if resume.remapped:
            finished = resume.plan.length == 0
        else:
            finished = bool(saved.ranks[self.rank].epoch_finished)
        self._plan_values = resume.plan.encode() if resume.remapped else saved.plan_values
        self._progress = _Progress(resume.epoch, resume.plan, resume.batches_consumed, resume.samples_consumed, finished)
        self._sampler_snapshot = saved.sampler_states.get(self.rank)
        self._generation += 1


class _ResumingIterator:
    """Yields the inner DataLoader's batches and tells the loader each one was consumed."""

    def __init__(self, loader: ResumableDataLoader, inner: Iterator[Any], generation: int) -> None:
        self._loader = loader
        self._inner = inner
        self._generation = generation

    def __iter__(self) -> _ResumingIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        loader = self._loader
        if self._generation != loader._generation:
            self._inner = iter(())
            raise RuntimeError(
                "this ResumableDataLoader iterator is stale: the loader was re-iterated, or "
                "load_state_dict()/set_epoch() moved it; call iter(loader) to continue from its position"
            )
        try:
            batch = next(self._inner)
        except StopIteration:
            loader._exhausted()
            raise
        loader._consumed()
        return batch


def _recording_sizes(
    requests: Iterator[BatchRequest], sizes: collections.deque[int], first_batch: int, states: DatasetStates | None
) -> Iterator[BatchRequest]:
    # Batches come back in request order (in_order=True), so the sizes queue tells the
    # size of each batch as it is yielded.
    for sent, request in enumerate(requests):
        sizes.append(len(request.indices))
        if states is not None:
            # Request `sent` goes to worker `sent % roles`: its first one restores its role's state.
            role = states.role(first_batch + sent)
            request = request._replace(role=role, restore=states.restore(role) if sent < states.roles else None)
        yield request


def _data_parallel_shard(rank: int | None, world_size: int | None, process_group) -> tuple[int, int]:
    if (rank is None) != (world_size is None):
        raise ValueError(f"give both rank and world_size, or neither (got rank={rank}, world_size={world_size})")
    if rank is None:
        if isinstance(process_group, DeviceMesh):
            if process_group.ndim != 1:
                raise ValueError(
                    f"process_group is a {process_group.ndim}-D DeviceMesh; pass its data-parallel "
                    'dimension, for example mesh["dp"]'
                )
            process_group = process_group.get_group()
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
        elif process_group is not None:
            raise ValueError("process_group was given but torch.distributed is not initialized")
        else:
            rank, world_size = 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    return rank, world_size
