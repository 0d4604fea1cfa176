"""`ResumableDataLoader`: torch's DataLoader that knows where it is, and resumes there."""

from __future__ import annotations

import collections
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.utils.data import DataLoader, Dataset, IterableDataset

from .dataset_order import (
    definition_digest,
    position_order,
    resume_definition,
    save_definition,
)
from .dataset_state import DATASET_KEY, DatasetStates, TaggingCollate
from .elastic_plan import Plan, rank_positions
from .fetch import BatchRequest, SeededDataset, SingleSample
from .layout import Layout, TailMode
from .remap import resume_rank
from .sample_rng import parse_choice
from .sampler_rng import SAMPLER_RNG_KEY, SamplerRandomness
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
from .worker_roles import UserDatasetInit, is_stateful

# Positions mapped to indices per vectorized call: large enough that the per-call
# cost of tensor operations vanishes, small enough that the first batch is quick.
_POSITIONS_PER_CHUNK = 16384

_T_co = TypeVar("_T_co", covariant=True)


class _RequestSampler:
    """The batch sampler of the inner DataLoader: each `iter()` asks the loader for the
    requests of its current position, so persistent workers follow resumes. It refers to
    the loader weakly: the loader owns the inner DataLoader, and a cycle would keep
    persistent workers alive after the loader is dropped."""

    def __init__(self, loader: ResumableDataLoader) -> None:
        self._loader = weakref.ref(loader)

    def __iter__(self) -> Iterator[BatchRequest]:
        return self._owner()._requests()

    def __len__(self) -> int:
        return len(self._owner())

    def _owner(self) -> ResumableDataLoader:
        loader = self._loader()
        if loader is None:
            raise RuntimeError("the ResumableDataLoader of this sampler was deleted")
        return loader


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


class ResumableDataLoader(DataLoader[_T_co]):
    """A drop-in `torch.utils.data.DataLoader` that can stop anywhere and resume on the
    exact next sample, at the same or another world size (GUARANTEES G1-G6).

    Takes every argument of `DataLoader`, with the same meaning, plus:

    - `seed`: the epoch order (with `shuffle=True`) and per-sample randomness are drawn
      from `(seed, epoch)` and `(seed, epoch, position)`. Default: drawn from `generator`,
      else from torch's default generator as `RandomSampler` draws its seed (so
      `torch.manual_seed` decides it), except at world size > 1 without `generator`: 0, as
      `DistributedSampler`, so that every rank has the same order. A default seed is
      recorded in the state and adopted from a loaded state (G6).
    - `rank`, `world_size`, `process_group`: the data-parallel shard. By default from
      `torch.distributed` when it is initialized (`process_group` may be a group or a 1-D
      `DeviceMesh`), else rank 0 of 1. `batch_size` is per rank.
    - `even_batches` (with `drop_last=False`): pad the final global batch from the start
      of the epoch so every rank gets the same number of batches (default), or not.
    - `deterministic_transforms`: per-sample randomness (G4). True: each of the `torch`
      (CPU), `random` and `numpy` global generators that the dataset draws from is seeded
      before every sample from `(seed, epoch, position)` (found by watching each batch;
      a batch that drew unseeded is fetched again, seeded). A set of those names: exactly
      those, from the first sample. False: none. The caller's generator states are put
      back after each batch. For an IterableDataset, any true value seeds all three at the
      start of each worker's stream, from `(seed, epoch, rank, worker)`.
    - `snapshot_every` (IterableDataset with `state_dict`/`load_state_dict`): each worker
      saves its dataset's state after every `snapshot_every`-th batch it produces; a
      resume loads the last snapshot of a yielded batch and replays the fewer than
      `snapshot_every` batches since (exact at any step; 1: no replay, a state round-trip
      per batch).

    An `IterableDataset` is resumed per worker (same world size and `num_workers`), or, for
    a `ShardedStream`, at any world size and `num_workers` (see `dist_resume.streams.cursor`).

    Iteration follows torchdata's `StatefulDataLoader`: each `iter()` is a new pass, the
    next epoch once the current one has yielded a batch (so a batch peeked with
    `next(iter(loader))` is trained in the next pass), unless `set_epoch` chose an epoch.
    `load_state_dict` takes effect at the next `iter()`, which continues exactly from the
    loaded position: a state taken after the epoch's last batch but before the iterator
    ended resumes into no batches; one taken after it ended resumes at the next epoch.
    An iterator that was running stops with an error rather than mix states.
    `set_epoch(e)` is forwarded to the dataset and to a sampler or batch sampler that
    define it, for every epoch the loader serves.
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
        deterministic_transforms: bool | Iterable[str] = True,
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
        self.rank, self.world_size = _data_parallel_shard(rank, world_size, process_group)
        # A seed the user did not give is adopted from a loaded state (G6).
        self._seed_given = seed is not None
        if seed is None:
            seed = _default_seed(generator, self.world_size)
        if not 0 <= seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        self.seed = seed
        self._stream = StreamCursor(dataset, num_workers, snapshot_every) if isinstance(dataset, IterableDataset) else None
        self.shuffle = dataset.shuffle if isinstance(dataset, ShardedStream) else bool(shuffle)
        self.even_batches = even_batches
        self.deterministic_transforms = parse_choice(deterministic_transforms)
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
        self._dataset_length = self._current_length()
        self._progress = _Progress(0, Plan(self._dataset_length, self._mode, 0))
        # A state was loaded: the next iter() continues it exactly, even into no batches.
        self._resume_pending = False
        # The elastic plan this job loaded: fixed until the next load, so that every rank
        # saves the same replicated value (DCP keeps one copy of it), whatever its epoch.
        self._plan_values: list[int] = []
        self._sampler_snapshot: Any = None  # a stateful user sampler's state at the epoch's start
        self._sampler_rng = SamplerRandomness(self._user_sampler)  # a random one's generator state
        self._generation = 0
        self._sizes: collections.deque[int] = collections.deque()
        self._inner: DataLoader | None = None
        stateful_dataset = self._stream is None and is_stateful(dataset)
        self._dataset_states = DatasetStates(dataset, num_workers) if stateful_dataset else None

    # -- what the loader is -------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch the next `iter()` serves: the one in progress, the next once the last
        batch of the current one was consumed, or a loaded state's (a finished one's pass
        yields no batches)."""
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
        self._forward_epoch(epoch)
        progress = self._progress
        if epoch == progress.epoch and (self._resume_pending or not self._started(progress)):
            progress.chosen = True  # a loaded state's position, even the end of the epoch
            return
        if progress.batches and not progress.finished and epoch != progress.epoch:
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

    def _current_length(self) -> int:
        # Read at the start of every pass: a dataset may grow between epochs.
        return self._stream.length if self._stream is not None else len(self.dataset)

    def _switch_epoch(self, epoch: int) -> None:
        self._resume_pending = False
        self._dataset_length = self._current_length()
        self._progress = _Progress(epoch, self._plan_for(epoch))
        self._sampler_snapshot = None
        self._sampler_rng.reset()
        if self._stream is not None:
            self._stream.start_epoch()
        self._generation += 1

    def _started(self, progress: _Progress) -> bool:
        return bool(progress.batches or progress.finished)

    def _next_progress(self) -> _Progress:
        progress = self._progress
        if self._resume_pending or progress.chosen:
            return progress
        if progress.finished:
            epoch = progress.epoch + 1
        elif not self._started(progress):
            epoch = progress.epoch
        else:
            return progress  # the epoch in progress (a new iter() would start the next one)
        length = self._current_length()
        return _Progress(epoch, self._plan_for(epoch) if length == self._dataset_length else Plan(length, self._mode, epoch))

    def _forward_epoch(self, epoch: int) -> None:
        for target in (self.dataset, self._user_sampler):
            set_epoch = getattr(target, "set_epoch", None)
            if callable(set_epoch) and not isinstance(target, ShardedStream):
                set_epoch(epoch)

    # -- iteration ----------------------------------------------------------------

    def __iter__(self) -> Iterator[_T_co]:
        progress = self._progress
        if not (self._resume_pending or progress.chosen):
            self._switch_epoch(progress.epoch + 1 if self._started(progress) else progress.epoch)
        self._resume_pending = False
        self._progress.chosen = False
        self._forward_epoch(self._progress.epoch)
        self._generation += 1
        self._sizes = collections.deque()
        if self._stream is not None:
            inner = self._stream.loader(self, self._progress.epoch, self.rank, self.world_size,
                                        self.deterministic_transforms, self.seed)
            batches = iter(inner)
            return _ResumingIterator(self, self._stream.yielded(batches, self._sizes), self._generation, batches)
        batches = iter(self._inner_loader())
        inner = self._dataset_states.yielded(batches) if self._dataset_states is not None else batches
        return _ResumingIterator(self, inner, self._generation, batches)

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
                worker_init_fn=UserDatasetInit(self.worker_init_fn),
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
            starts, consecutive = _consecutive_batches(positions, sizes)
            # A batch of consecutive positions (all but padded or remapped ones) is sent as a
            # range: no list built, a few bytes pickled to a worker.
            listed = None if all(consecutive) else positions.tolist()
            offset = 0
            for size, start, in_order in zip(sizes, starts, consecutive):
                batch_positions = range(start, start + size) if in_order else listed[offset : offset + size]
                yield BatchRequest(epoch, batch_positions, indices[offset : offset + size])
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
        elif self._sampler_rng.applies:
            sampler = self._sampler_rng.iterate(sampler)
        # Resume by replaying the sampler's indices (no data is fetched) up to the
        # consumed count: a sampler's stream cannot be entered in the middle.
        position = 0
        if self._sampling is Sampling.BATCH_SAMPLER:
            for index, batch in enumerate(sampler):
                indices = list(batch)
                if index >= first_batch:
                    yield BatchRequest(epoch, range(position, position + len(indices)), indices)
                position += len(indices)
            return
        pending: list[int] = []
        for index in sampler:
            if position >= first_sample:
                pending.append(index)
                if len(pending) == self._rank_batch_size:
                    yield BatchRequest(epoch, range(position - len(pending) + 1, position + 1), pending)
                    pending = []
            position += 1
        if pending and not self.drop_last:
            yield BatchRequest(epoch, range(position - len(pending), position), pending)

    def _consumed(self) -> None:
        """The current iterator handed one more batch to the training loop."""
        progress = self._progress
        progress.batches += 1
        progress.samples += self._sizes.popleft()
        if self._sampling is Sampling.EPOCH_ORDER and progress.batches == self._layout(progress).num_batches(self.rank):
            progress.finished = True

    def _exhausted(self) -> None:
        # The pass ended: from now on the loader stands at the start of the next epoch,
        # which is what a state taken now resumes (as StatefulDataLoader's does).
        self._switch_epoch(self._progress.epoch + 1)

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
        sampler_rng = self._sampler_rng.state()
        if sampler_rng is not None:
            state_dict[rank_key(self.rank)][SAMPLER_RNG_KEY] = sampler_rng
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a saved state at the next `iter()` (G1, G6). `state_dict` holds this
        rank's entry, or the entries of every saved rank (needed when the world size or the
        batch size changed: the remaining samples are then re-partitioned, G2, G3)."""
        saved = decode(state_dict)
        self._dataset_length = self._current_length()
        if not self._seed_given:
            self.seed = saved.any.seed
        adopt_definition = resume_definition(self.dataset, state_dict, saved)
        saved.check_identity(self.identity)
        adopt_definition()
        if self._stream is not None:
            own = self._stream.load(state_dict, saved, self.rank, self.world_size)
            self._progress = _Progress(own.epoch, self._plan_for(own.epoch), own.batches_consumed,
                                       own.samples_consumed, bool(own.epoch_finished))
            self._resume_pending = True
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
        self._sampler_rng.load(state_dict.get(rank_key(self.rank), {}).get(SAMPLER_RNG_KEY))
        self._resume_pending = True
        self._generation += 1


class _ResumingIterator:
    """Yields the inner DataLoader's batches and tells the loader each one was consumed."""

    def __init__(self, loader: ResumableDataLoader, inner: Iterator[Any], generation: int, batches: Iterator[Any]) -> None:
        self._loader = loader
        self._inner = inner
        self._generation = generation
        self._ended = False
        self._batches = batches  # torch's iterator under `inner`

    @property
    def _workers(self) -> list[Any]:
        """The worker processes, as torch's iterator names them (code that joins them reads this)."""
        return getattr(self._batches, "_workers", [])

    def __iter__(self) -> _ResumingIterator:
        return self

    def __len__(self) -> int:
        return len(self._loader)

    def __next__(self) -> Any:
        loader = self._loader
        if self._ended:
            raise StopIteration
        if self._generation != loader._generation:
            self._inner = iter(())
            raise RuntimeError(
                "this ResumableDataLoader iterator is stale: the loader was re-iterated, or "
                "load_state_dict()/set_epoch() moved it; call iter(loader) to continue from its position"
            )
        try:
            batch = next(self._inner)
        except StopIteration:
            self._ended = True
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


def _consecutive_batches(positions: torch.Tensor, sizes: list[int]) -> tuple[list[int], list[bool]]:
    """For batches of `sizes` laid end to end in `positions`: each one's first position, and
    whether its positions are consecutive."""
    if not sizes:
        return [], []
    counts = torch.tensor(sizes)
    offsets = counts.cumsum(0) - counts
    breaks = torch.zeros(positions.numel(), dtype=torch.int64)
    breaks[1:] = (positions[1:] - positions[:-1] != 1).cumsum(0)
    consecutive = breaks[offsets + counts - 1] == breaks[offsets]
    return positions[offsets].tolist(), consecutive.tolist()


def _default_seed(generator: torch.Generator | None, world_size: int) -> int:
    if generator is None and world_size > 1:
        return 0
    if generator is not None:
        # Drawn from a copy: the user's generator goes on to seed the workers exactly as
        # under torch's DataLoader (its first draw of an iterator is the workers' base seed).
        copy = torch.Generator(device=generator.device)
        copy.set_state(generator.get_state())
        generator = copy
    # RandomSampler's draw: int64 random_() covers [0, 2**63).
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


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
