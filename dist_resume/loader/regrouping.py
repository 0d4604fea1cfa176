"""`ResumableDataLoader.regroup`: serve the rest of an epoch over another set of ranks, from the
global steps that count as consumed. Replica groups of a fault-tolerant job join and leave
between steps, and a step they trained may not commit (`dist_resume.integrations.torchft`)."""

from __future__ import annotations

from dist_resume.arguments import checked_int
from dist_resume.loader.progress import Progress
from dist_resume.positions.layout import Layout
from dist_resume.state.fields import Sampling


class Regrouping:
    """`regroup` and `home_shard` of `ResumableDataLoader` (a mixin over its position:
    `_progress`, `_plan_values`, `_resume_pending`, `_generation`, `_global_step`, `_skips`,
    `_seed_given`, and its `_layout` and `_switch_epoch`)."""

    _home: tuple[int, int] | None = None  # the shard the loader was built with, once regroup moved it

    @property
    def home_shard(self) -> tuple[int, int]:
        """`(rank, world_size)` of the loader's own data-parallel shard, as built: its state
        (`state_dict`, `load_state_dict`) is always this shard's, whatever `regroup` serves."""
        return self._home if self._home is not None else (self.rank, self.world_size)

    def regroup(self, rank: int, world_size: int, consumed: int | None = None) -> None:
        """Serve the rest of the current epoch as rank `rank` of `world_size` ranks (of
        `batch_size` each), once the first `consumed` global steps of the loader's current
        layout count as consumed by all of its ranks (default: as many as this rank consumed).
        Batches this rank was handed beyond them are served again, re-partitioned; steps it
        was not handed (its peers trained them) count as if it had been (G2).

        Like `load_state_dict`, it takes effect at the next `iter()`: a running iterator
        stops with an error, the batches its workers prefetched are dropped, never yielded.
        If the consumed steps complete the epoch, the next `iter()` serves the next one.
        `loader.rank` and `loader.world_size` become the served shard; the state stays the
        loader's own shard's (`home_shard`), at the position the consumed steps reach, so a
        checkpoint taken now resumes at any world size exactly there (G1-G3). For map-style
        datasets and Mixtures of them in the loader's own order, with a given `seed`, without
        `skip`."""
        self._check_regroupable()
        rank = checked_int("rank", rank, 0)
        world_size = checked_int("world_size", world_size, 1)
        if rank >= world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
        progress = self._progress
        layout = self._layout(progress)
        steps = layout.num_batches(0)
        done = progress.batches if consumed is None else checked_int("consumed", consumed, 0)
        if done > steps:
            raise ValueError(f"consumed={done} global steps, but epoch {progress.epoch} has {steps} "
                             f"at world size {self.world_size}")
        home = self.home_shard
        self._global_step += done - progress.batches
        if done and done == steps:
            self._switch_epoch(progress.epoch + 1)
        elif done or progress.batches:
            plan = progress.plan.after(layout, _lockstep(layout, done)) if done else progress.plan
            self._plan_values = plan.encode() if done else self._plan_values
            self._progress = Progress(progress.epoch, plan)
            self._resume_pending = True
        self._home = home
        self.rank, self.world_size = rank, world_size
        self._generation += 1

    def _check_regroupable(self) -> None:
        what = None
        if self._sampling is Sampling.STREAM:
            what = "an IterableDataset (a ShardedStream or a Mixture of streams reads by its own global steps)"
        elif self._sampling is not Sampling.EPOCH_ORDER:
            what = "a custom sampler or batch_sampler"
        elif not self.in_order:
            what = "in_order=False"
        elif self._dataset_states is not None:
            what = "a stateful map-style dataset (its states resume at one world size)"
        elif not self._seed_given:
            what = "a seed drawn in this process (the ranks it serves with must share its epoch order: pass seed=)"
        elif self._skips.ranges:
            what = "skipped ranges (skip)"
        if what is not None:
            raise ValueError("regroup() serves map-style datasets and Mixtures of them in the loader's own order, "
                             f"in_order=True, without skip(); this loader has {what}")

    def _saved_position(self) -> tuple[int, int, list[int], Progress]:
        """The shard, elastic plan and position a state records: the loader's own shard's.
        Once `regroup` serves another shard, the position its consumed batches reach (every
        rank of the served layout in lockstep), from which the own shard continues."""
        progress = self._progress
        if self._home is None or self._home == (self.rank, self.world_size):
            return self.rank, self.world_size, self._plan_values, progress
        rank, world_size = self._home
        if progress.finished:
            # The state a pass that ended leaves (the next epoch, not started).
            return rank, world_size, self._plan_values, Progress(progress.epoch + 1, self._plan_for(progress.epoch + 1))
        if not progress.batches:
            return rank, world_size, self._plan_values, progress
        layout = self._layout(progress)
        plan = progress.plan.after(layout, _lockstep(layout, progress.batches))
        return rank, world_size, plan.encode(), Progress(progress.epoch, plan)


def _lockstep(layout: Layout, steps: int) -> list[int]:
    """Batches each rank of `layout` consumed in its first `steps` global steps."""
    return [min(steps, layout.num_batches(rank)) for rank in range(layout.world_size)]

