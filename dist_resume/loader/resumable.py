"""`ResumableDataLoader`: torch's DataLoader that knows where it is, and resumes there."""

from __future__ import annotations

import collections
import warnings
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.loader.dataset_states import DatasetStates, TaggingCollate
from dist_resume.loader.defaults import check_global_batch, data_parallel_shard, default_seed
from dist_resume.loader.epochs import EpochChoice, following
from dist_resume.loader.fetch import BatchRequest, SeededDataset, SingleSample
from dist_resume.loader.progress import Progress, ResumingIterator, StreamLength
from dist_resume.loader.rebuild_guard import RebuildGuard
from dist_resume.loader.regrouping import Regrouping
from dist_resume.loader.requests import BatchRequests, RequestSampler
from dist_resume.loader.saving import LoaderState
from dist_resume.loader.single_process import SingleProcessBatches, SingleProcessItems, serves
from dist_resume.loader.skipping import BatchSkipping
from dist_resume.loader.split_by_node import check_not_split_by_node
from dist_resume.loader.unordered import (NumberedDataset, NumberedRequest, NumberingCollate, arrivals,
                                          check_unordered, deliver)
from dist_resume.positions.dataset_order import definition_digest
from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.layout import Layout, TailMode
from dist_resume.randomness.per_sample import parse_choice
from dist_resume.randomness.sampler import SamplerRandomness
from dist_resume.state.fields import Identity, Sampling
from dist_resume.state.skips import SkipLedger
from dist_resume.streams.cursor import stream_cursor
from dist_resume.streams.sharded import ShardedStream
from dist_resume.workers.by_value import by_value
from dist_resume.workers.roles import UserDatasetInit, is_stateful

_T_co = TypeVar("_T_co", covariant=True)


class ResumableDataLoader(EpochChoice, BatchRequests, BatchSkipping, Regrouping, LoaderState, DataLoader[_T_co]):
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

    - `in_order=False` (map-style datasets and Mixtures in the loader's own order, and
      IterableDatasets and Mixtures of streams): batches reach the loop in the order workers
      finish them, as with torch's DataLoader. The state records the consumed prefix and the
      batches delivered beyond it (at most `num_workers * prefetch_factor` missing ones; for a
      `ShardedStream` or a Mixture of streams, whose workers then read whole batches of their
      own runs of items or positions, the batches each worker handed on); a resume, at any world size, batch size or `num_workers` (other
      IterableDatasets: the same ones), trains every sample of the epoch exactly once (G1,
      G2), each with its own seed (G4), in an order that is not the uninterrupted one (no G3).

    An `IterableDataset` is resumed per worker (same world size and `num_workers`). A
    `ShardedStream`, or a Mixture of them, keeps the map-style promises: its global batches
    are the same at every world size and `num_workers` for one global batch size (G3), every
    item comes once per epoch across any resumes, also at another global batch (G2), every
    rank gets `len(loader)` batches per epoch (`drop_last`, `even_batches` as for map-style
    data), its state is a few integers (docs/stream-determinism.md, docs/stream-mixtures.md).

    Iteration follows torchdata's `StatefulDataLoader`: each `iter()` is a new pass, the
    next epoch once the current one has yielded a batch (so a batch peeked with
    `next(iter(loader))` is trained in the next pass), unless `set_epoch` chose an epoch.
    `load_state_dict` takes effect at the next `iter()`, which continues exactly from the
    loaded position: a state taken after the epoch's last batch but before the iterator
    ended resumes into no batches; one taken after it ended resumes at the next epoch.
    An iterator that was running stops with an error rather than mix states.
    `skip(batches)` passes over the next global batches without reading them (see `skip`).
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
        self.rank, self.world_size = data_parallel_shard(rank, world_size, process_group)
        check_global_batch(batch_size, self.world_size)
        # A seed the user did not give is adopted from a loaded state (G6).
        self._seed_given = seed is not None
        if seed is None:
            seed = default_seed(generator, self.world_size)
        self.seed = checked_int("seed", seed, 0, INT64_LIMIT)
        self._stream = stream_cursor(dataset, sampler is not None or batch_sampler is not None, num_workers,
                                     snapshot_every, persistent_workers, self.world_size, batch_size or 1, in_order)
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
            check_not_split_by_node(dataset, self.rank, self.world_size, process_group)
            # DataLoader's own attributes are frozen after its __init__.
            object.__setattr__(self, "sampler", RebuildGuard(self.sampler, "sampler"))
            object.__setattr__(self, "batch_sampler", RebuildGuard(self.batch_sampler, "batch_sampler")
                               if self.batch_sampler is not None else None)
        self._rank_batch_size = batch_size if batch_size is not None else 1
        self._mode = TailMode.of(drop_last, even_batches)
        self._dataset_length = self._current_length()
        self._progress = Progress(0, Plan(self._dataset_length, self._mode, 0))
        self._global_step = 0  # global steps of the run this rank took part in (saved: mixed saves are refused)
        # A state was loaded: the next iter() continues it exactly, even into no batches.
        self._resume_pending = False
        # The elastic plan this job loaded: fixed until the next load, so that every rank
        # saves the same replicated value (DCP keeps one copy of it), whatever its epoch.
        self._plan_values: list[int] = []
        self._skips = SkipLedger()  # what skip() passed over, saved with the state
        self._sampler_snapshot: Any = None  # a stateful user sampler's state at the epoch's start
        self._sampler_rng = SamplerRandomness(self._user_sampler)  # a random one's generator state
        self._generation = 0
        self._sizes: collections.deque[int] = collections.deque()
        self._pass_batches = -1  # batches of the pass being iterated (epoch order; -1: unknown)
        self._inner: DataLoader | None = None
        stateful_dataset = self._stream is None and is_stateful(dataset)
        if not in_order:
            check_unordered(dataset, self._sampling, stateful_dataset)
        self._arrivals: collections.deque[int] = collections.deque()  # in_order=False: numbers of batches handed on
        self._dataset_states = DatasetStates(dataset, num_workers) if stateful_dataset else None

    # -- what the loader is -------------------------------------------------------

    @property
    def identity(self) -> Identity:
        return Identity(self._dataset_length, self.seed, self.shuffle, self.drop_last, self.even_batches, self._sampling,
                        definition_digest(self.dataset))

    def _layout(self, progress: Progress) -> Layout:
        return Layout(progress.plan.length, self.world_size, self._rank_batch_size, self._mode)

    def __len__(self) -> int:
        """Batches this rank yields in the epoch the next `iter()` serves (in total)."""
        progress = self._next_progress()
        if self._sampling is Sampling.EPOCH_ORDER:
            return self._layout(progress).num_batches(self.rank)
        batches = -1 if self._stream is None else self._stream.batches(self, progress, progress is not self._progress)
        return batches if batches >= 0 else super().__len__()

    # -- iteration ----------------------------------------------------------------

    def __iter__(self) -> Iterator[_T_co]:
        progress = self._progress
        if not (self._resume_pending or progress.chosen):
            self._switch_epoch(following(progress.epoch) if progress.started else progress.epoch)
        self._resume_pending = False
        self._progress.chosen = False
        self._forward_epoch(self._progress.epoch)
        self._generation += 1
        self._sizes = collections.deque()
        # Fixed while this pass's iterator is current: anything that moves the loader makes it stale.
        epoch_order = self._sampling is Sampling.EPOCH_ORDER
        self._pass_batches = self._layout(self._progress).num_batches(self.rank) if epoch_order else -1
        if self._stream is not None:
            self._pass_batches = self._stream.batches(self, self._progress, False)  # -1: unknown
            inner = self._stream.loader(self, self._progress.epoch, self.rank, self.world_size,
                                        self.deterministic_transforms, self.seed)
            batches = SingleProcessItems(inner) if serves(inner) else iter(inner)
            stream_length = StreamLength(self._IterableDataset_len_called, self.dataset, self.num_workers)
            return self._resuming(self._stream.yielded(batches, self._sizes), batches, stream_length)
        loader = self._inner_loader()
        batches = SingleProcessBatches(loader) if serves(loader) else iter(loader)
        inner = self._dataset_states.yielded(batches) if self._dataset_states is not None else batches
        if not self.in_order:
            self._arrivals = collections.deque()
            inner = arrivals(batches, self._arrivals)
        return self._resuming(inner, batches)

    def _resuming(self, inner: Iterator[Any], batches: Iterator[Any], stream_length: StreamLength | None = None
                  ) -> ResumingIterator:
        generation = self._generation
        return ResumingIterator(inner, batches, is_current=lambda: generation == self._generation,
                                consumed=self._consumed, exhausted=self._exhausted, length=self.__len__,
                                stream_length=stream_length)

    def _inner_loader(self) -> DataLoader:
        if self._inner is None:
            collate = self.collate_fn if self._auto_collation else SingleSample(self.collate_fn)
            if self._dataset_states is not None:
                collate = TaggingCollate(collate)
            dataset, wire = (SeededDataset, BatchRequest.wire) if self.in_order else (NumberedDataset, NumberedRequest.wire)
            self._inner = DataLoader(
                dataset(self.dataset, self.seed, self.deterministic_transforms),
                batch_sampler=RequestSampler(weakref.WeakMethod(self._requests), weakref.WeakMethod(self.__len__),
                                             wire if self.num_workers else None),
                num_workers=self.num_workers,
                in_order=self.in_order,
                collate_fn=by_value(collate if self.in_order else NumberingCollate(collate), self.num_workers),
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

    def _consumed(self) -> None:
        """The current iterator handed one more batch to the training loop."""
        progress = self._progress
        self._global_step += 1
        if not self.in_order and self._stream is None:
            return deliver(progress, self._arrivals.popleft(), self._layout(progress), self.rank)
        progress.batches += 1
        progress.samples += self._sizes.popleft()
        if progress.batches == self._pass_batches:
            progress.finished = True

    def _exhausted(self) -> None:
        # The pass ended: from now on the loader stands at the start of the next epoch,
        # which is what a state taken now resumes (as StatefulDataLoader's does).
        if self._sampling is Sampling.EPOCH_ORDER:
            # A rank with a batch less (even_batches=False) ends its pass during the last global
            # step, which its peers train: it counts that step as they do.
            self._global_step += self._layout(self._progress).num_batches(0) - self._pass_batches
        self._pass_ended()
