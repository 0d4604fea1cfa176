"""Saving and loading a `ResumableDataLoader`'s position (G1-G6)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dist_resume.arguments import checked_flag
from dist_resume.loader.progress import Progress
from dist_resume.positions.dataset_order import definition_digest, resume_definition, save_definition
from dist_resume.positions.remap import resume_rank
from dist_resume.randomness.sampler import SAMPLER_RNG_KEY
from dist_resume.state.delivered import DELIVERED_KEY, Delivered
from dist_resume.state.fields import DATASET_KEY, FORMAT_VERSION, RankState, Sampling, encode, plan_digest, rank_key
from dist_resume.state.saved import SavedStates, decode
from dist_resume.streams.cursor import STREAM_KEY


class LoaderState:
    """`state_dict` and `load_state_dict` of `ResumableDataLoader` (a mixin)."""

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: int64 tensors under a key unique to the rank (G5). After
        `regroup`, the position of the loader's own shard (`home_shard`)."""
        rank, world_size, plan_values, progress = self._saved_position()
        state = RankState(
            version=FORMAT_VERSION,
            dataset_length=self._dataset_length,
            seed=self.seed,
            shuffle=int(self.shuffle),
            drop_last=int(self.drop_last),
            even_batches=int(self.even_batches),
            sampling=int(self._sampling),
            epoch=progress.epoch,
            world_size=world_size,
            rank=rank,
            batch_size=self._rank_batch_size,
            global_batch=world_size * self._rank_batch_size,
            batches_consumed=progress.batches,
            samples_consumed=progress.samples,
            epoch_finished=int(progress.finished),
            plan_digest=plan_digest(plan_values),
            dataset_digest=definition_digest(self.dataset),
            global_step=self._global_step,
        )
        sampler_state = None
        if callable(getattr(self._user_sampler, "state_dict", None)):
            sampler_state = self._sampler_snapshot if self._sampler_snapshot is not None else self._user_sampler.state_dict()
        state_dict = encode(state, plan_values, sampler_state)
        save_definition(self.dataset, state_dict)
        self._skips_entry(state_dict)
        if self._stream is not None:
            state_dict[rank_key(rank)][STREAM_KEY] = self._stream.state()
        if self._dataset_states is not None:
            state_dict[rank_key(rank)][DATASET_KEY] = self._dataset_states.state()
        if not self.in_order and self._stream is None:
            delivered = progress.delivered if progress.delivered is not None else Delivered(progress.batches)
            state_dict[rank_key(rank)][DELIVERED_KEY] = delivered.encode()
        sampler_rng = self._sampler_rng.state()
        if sampler_rng is not None:
            state_dict[rank_key(rank)][SAMPLER_RNG_KEY] = sampler_rng
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any], *, independent_ranks: bool = False) -> None:
        """Continue from a saved state at the next `iter()` (G1, G6). `state_dict` holds this
        rank's entry, or the entries of every saved rank (needed when the world size or the
        batch size changed: the remaining samples are then re-partitioned, G2, G3).

        Entries of one save stand at one global step; entries at different steps come from
        different saves (a rank stopped between its training step and the save) and are
        refused. Ranks that do not train in lockstep (no DDP: each stops where it stops)
        pass `independent_ranks=True`: their entries are resumed exactly once (G2) wherever
        each stopped.

        A refused state (`ResumeStateError`) changes nothing: the seed, epoch, position,
        plan, a Mixture's schedule and a stream's records are checked and prepared first,
        and only applied once the whole state is accepted. After `regroup`, the loader takes
        the state at its own shard (`home_shard`) and serves it from there."""
        saved = decode(state_dict)
        rank, world_size = self.home_shard
        if not checked_flag("independent_ranks", independent_ranks):
            saved.require_one_save(lambda rank: _steps_sat_out(saved, rank))
        length = self._current_length()
        seed = self.seed if self._seed_given else saved.any.seed  # a default seed is adopted
        adopt_definition = resume_definition(self.dataset, state_dict, saved)
        saved.check_identity(dataclasses.replace(self.identity, dataset_length=length, seed=seed))
        own_entry = state_dict.get(rank_key(rank), {})
        if self._stream is not None:
            own, adopt_stream = self._stream.accept(state_dict, saved, rank, world_size)
            # A stream's ranks count the same global steps at any world size: no renumbering.
            skips = self._saved_skips(state_dict, saved, False)
            self._adopt(saved, length, seed, adopt_definition)
            adopt_stream()
            self._skips = skips
            self._progress = Progress(own.epoch, self._plan_for(own.epoch), own.batches_consumed,
                                       own.samples_consumed, bool(own.epoch_finished))
            return
        resume = resume_rank(saved, world_size, self._rank_batch_size, rank)
        adopt_dataset_states = (lambda: None) if self._dataset_states is None else self._dataset_states.accept(
            own_entry.get(DATASET_KEY), saved.any.world_size, world_size)
        adopt_sampler_rng = self._sampler_rng.accept(own_entry.get(SAMPLER_RNG_KEY))
        if resume.remapped:
            finished = resume.plan.length == 0
        else:
            finished = bool(saved.ranks[rank].epoch_finished)
        skips = self._saved_skips(state_dict, saved, resume.remapped)
        self._adopt(saved, length, seed, adopt_definition)
        self._skips = skips
        adopt_dataset_states()
        adopt_sampler_rng()
        self._plan_values = resume.plan.encode() if resume.remapped else saved.plan_values
        self._progress = Progress(resume.epoch, resume.plan, resume.batches_consumed, resume.samples_consumed, finished)
        self._sampler_snapshot = saved.sampler_states.get(rank)

    def _adopt(self, saved: SavedStates, length: int, seed: int, adopt_definition: Callable[[], None]) -> None:
        """What every accepted state changes; a running iterator stops at its next batch."""
        self._dataset_length = length
        self._global_step = saved.global_step
        self.rank, self.world_size = self.home_shard
        if seed != self.seed:
            self.seed = seed
            # The inner loader's dataset wrapper, and its workers' copies, seed samples from
            # the seed they were made with: a new one is made at the next iter().
            self._inner = None
        adopt_definition()
        self._resume_pending = True
        self._generation += 1


def _steps_sat_out(saved: SavedStates, rank: int) -> int:
    """Global steps at the end of its finished epoch that `rank` has no batch of (even_batches=False)."""
    state = saved.ranks[rank]
    if not state.epoch_finished or state.sampling != Sampling.EPOCH_ORDER:
        return 0
    layout = resume_rank(saved, state.world_size, state.batch_size, rank).layout
    return layout.num_batches(0) - layout.num_batches(rank)
