"""`ResumableDataLoader` under PyTorch Lightning's `Trainer`.

Two things stand between Lightning and an exact resume, and `LightningLoader` handles both:

- Lightning reads one batch ahead of the one it trains when the train loader has no length
  (to know which batch is the last). The loader counts a batch as consumed when it hands it
  out, so its own state would skip the batch Lightning holds.
- Under DDP, Lightning writes the checkpoint of rank 0 only, so every rank resumes from rank
  0's loader state; and it rebuilds any `DataLoader` it is given with a `DistributedSampler`.
  The wrapper is not a `DataLoader` (Lightning iterates it as it is), and since DDP ranks
  train in lockstep, rank 0's state says where every rank stands: the wrapper saves every
  rank's entry, rebuilt from its own, so a resume at any world size is exact.

Lightning itself is never imported here: the wrapper is an iterable with `state_dict` /
`load_state_dict`, which is all Lightning's fit loop asks of a train loader.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from dist_resume.loader.resumable import ResumableDataLoader
from dist_resume.positions.layout import Layout, TailMode
from dist_resume.positions.remap import resume_rank
from dist_resume.state.fields import PROGRESS_KEY, RankState, ResumeStateError, Sampling, rank_key
from dist_resume.state.saved import decode
from dist_resume.state.skips import SKIPS_KEY


class LightningLoader:
    """A `ResumableDataLoader` as Lightning's train loader (`trainer.fit(model,
    train_dataloaders=LightningLoader(loader))`, or returned by `train_dataloader()`).

    Guarantee: the state Lightning checkpoints resumes on the first batch Lightning has not
    trained (G1), whether or not it read one ahead; under DDP it holds every rank's entry,
    so the checkpoint that Lightning writes from rank 0 resumes every rank exactly, at the
    same or another world size (G2, G3). A loader whose per-rank state cannot be rebuilt
    from one rank's (a custom sampler, an IterableDataset, a dataset with `state_dict`) is
    refused under DDP when iteration starts, before any training.
    """

    def __init__(self, loader: ResumableDataLoader) -> None:
        if not isinstance(loader, ResumableDataLoader):
            raise TypeError(f"LightningLoader wraps a ResumableDataLoader, got {type(loader).__name__}")
        self.loader = loader
        # The loader's state as of the batches Lightning trained, while it holds one more.
        self._trained_state: dict[str, Any] | None = None

    def __len__(self) -> int:
        """Batches of a whole epoch, as Lightning counts them: it reads the length once, when
        training starts, and counts the steps a resumed epoch trained before the resume. The
        loader's own length counts what is left of an epoch re-partitioned at a resume."""
        identity = self.loader.identity
        if identity.sampling is not Sampling.EPOCH_ORDER:
            return len(self.loader)
        mode = TailMode.of(identity.drop_last, identity.even_batches)
        return Layout(identity.dataset_length, self.loader.world_size, self.loader.batch_size or 1, mode).num_batches(
            self.loader.rank)

    def __iter__(self) -> Iterator[Any]:
        self._check_shard()
        self._trained_state = None
        batches = iter(self.loader)
        if _has_length(self.loader):
            return batches  # Lightning reads no batch ahead of a loader with a length
        return self._one_ahead(batches)

    def _one_ahead(self, batches: Iterator[Any]) -> Iterator[Any]:
        # Lightning asks for batch k+1 when it starts training batch k; the end of the pass
        # comes with the last batch itself, so then nothing is held back.
        while True:
            before = self.loader.state_dict()
            try:
                batch = next(batches)
            except StopIteration:
                self._trained_state = None
                return
            self._trained_state = before
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The loader's state as of the batches Lightning trained; under DDP, every rank's."""
        own = self._trained_state if self._trained_state is not None else self.loader.state_dict()
        if self.loader.world_size == 1:
            return own
        return _every_rank(own, self.loader)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a state of `state_dict()` at the next `iter()`, at any world size
        that keeps the global batch (`world_size * batch_size`)."""
        saved = decode(state_dict)
        global_batch = self.loader.world_size * (self.loader.batch_size or 1)
        if saved.any.global_batch != global_batch and _has_length(self.loader):
            raise ResumeStateError(
                f"loader state was saved with a global batch of {saved.any.global_batch} (world size "
                f"{saved.any.world_size} x batch size {saved.any.batch_size}); this loader's is {global_batch}: "
                "under Lightning, keep the global batch when resuming (Lightning counts an epoch's steps once, "
                "when training starts)"
            )
        self._trained_state = None
        self.loader.load_state_dict(state_dict)

    def _check_shard(self) -> None:
        loader = self.loader
        if dist.is_available() and dist.is_initialized() and loader.world_size == 1 < dist.get_world_size():
            raise ResumeStateError(
                f"this ResumableDataLoader serves rank 0 of 1, but torch.distributed runs {dist.get_world_size()} "
                "processes: it was built before Lightning started them; build it in train_dataloader() of the "
                "LightningModule or LightningDataModule"
            )
        if loader.world_size > 1:
            _own_entry(loader.state_dict(), loader.rank)


def _has_length(loader: ResumableDataLoader) -> bool:
    # The test Lightning applies (lightning.fabric.utilities.data.sized_len).
    try:
        len(loader)
    except (TypeError, NotImplementedError):
        return False
    return True


def _own_entry(state_dict: dict[str, Any], rank: int) -> dict[str, Any]:
    key = rank_key(rank)
    entry = state_dict[key]
    # The ranges loader.skip() passed over are the same on every rank.
    if RankState.from_tensor(entry[PROGRESS_KEY], key).sampling != Sampling.EPOCH_ORDER or \
            set(entry) - {SKIPS_KEY} != {PROGRESS_KEY}:
        raise ResumeStateError(
            "Lightning checkpoints the loader state of rank 0 only, and this loader's state differs per rank "
            "beyond its position (a custom sampler or batch_sampler, an IterableDataset, or a dataset with "
            "state_dict/load_state_dict): under DDP, LightningLoader needs the loader's own sampling "
            "(no sampler) over a map-style dataset without state_dict"
        )
    return entry


def _every_rank(own: dict[str, Any], loader: ResumableDataLoader) -> dict[str, Any]:
    """Every rank's entry, rebuilt from this rank's: DDP ranks consume batches in lockstep,
    so rank `r` has consumed as many batches as this one, or all of its own if it has fewer."""
    _own_entry(own, loader.rank)
    saved = decode(own)
    state = saved.ranks[loader.rank]
    layout = resume_rank(saved, state.world_size, state.batch_size, loader.rank).layout
    merged = {key: value for key, value in own.items() if key != rank_key(loader.rank)}
    shared = {key: value for key, value in own[rank_key(loader.rank)].items() if key == SKIPS_KEY}
    for rank in range(state.world_size):
        batches = min(state.batches_consumed, layout.num_batches(rank))
        if layout.num_batches(rank) == layout.num_batches(loader.rank):
            finished = state.epoch_finished
        else:  # ranks' epochs differ by a batch (even_batches=False): as the loader marks an end
            finished = int(0 < batches == layout.num_batches(rank))
        # A rank with fewer batches stands the steps it had none of behind, as its own loader
        # reports before its pass ends (UNKNOWN_STEP stays unknown).
        step = state.global_step - (state.batches_consumed - batches) if state.global_step >= 0 else state.global_step
        entry = dataclasses.replace(state, rank=rank, batches_consumed=batches, global_step=step,
                                    samples_consumed=layout.slots_before(rank, batches), epoch_finished=finished)
        merged[rank_key(rank)] = {PROGRESS_KEY: entry.to_tensor(), **shared}
    return merged
