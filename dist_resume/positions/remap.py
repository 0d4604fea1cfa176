"""Elastic remapping: where each rank of a new job continues, from the states of the old one.

Pure arithmetic over the saved rank entries (no process group, no communication): every
new rank computes the same plan on its own. Work and memory are O(old ranks + new ranks).
Guarantees kept (see docs/guarantees.md): G2 — every position of the epoch is consumed once
across all resumes, whatever the world sizes; G3 — positions are consumed in the same
global-step order; with an unchanged global batch and ranks that stopped after the same
step, global step k holds the same samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.rank_batches import rank_positions
from dist_resume.positions.layout import Layout, TailMode
from dist_resume.state.fields import ResumeStateError, Sampling
from dist_resume.state.saved import SavedStates, decode


@dataclass(frozen=True)
class RankResume:
    """Where one rank continues: `batches_consumed` batches into `layout` over `plan`."""

    epoch: int
    plan: Plan
    layout: Layout
    batches_consumed: int
    samples_consumed: int
    remapped: bool  # re-partitioned from another world size or batch size


@dataclass(frozen=True)
class ResumePlan:
    """What every rank of a job of `layout.world_size` ranks consumes next in `epoch`."""

    epoch: int
    plan: Plan
    layout: Layout
    consumed: tuple[int, ...]  # batches each new rank already consumed of `layout`

    def remaining_batches(self, rank: int) -> int:
        return self.layout.num_batches(rank) - self.consumed[rank]

    def batches(self, rank: int) -> Iterator[PlannedBatch]:
        """The batches rank `rank` consumes next, in order."""
        for index in range(self.consumed[rank], self.layout.num_batches(rank)):
            positions, _ = rank_positions(self.plan, self.layout, rank, index, index + 1)
            yield PlannedBatch(positions.tolist(), self.layout.batch(rank, index).padding)


@dataclass(frozen=True)
class PlannedBatch:
    """Positions of one batch in the epoch order; the last `padding` of them repeat the
    start of the epoch (G2 padding)."""

    positions: list[int]
    padding: int


def plan_resume(state_dict: Mapping[str, Any], world_size: int, batch_size: int | None = None) -> ResumePlan:
    """The plan of a job of `world_size` ranks (per-rank `batch_size`, default: the saved
    one) resuming from a loader state that holds the entries of every saved rank."""
    saved = decode(state_dict)
    if Sampling(saved.any.sampling) is Sampling.STREAM:
        raise ResumeStateError(
            "loader state belongs to an IterableDataset: it resumes per shard or per worker stream, "
            "there is no position plan to show"
        )
    saved.require_complete("planning a resume")
    resumer = _Resumer(saved, world_size, batch_size or saved.any.batch_size)
    resumes = [resumer.rank(rank) for rank in range(world_size)]
    first = resumes[0]
    if any(r.epoch != first.epoch for r in resumes):
        raise ResumeStateError(
            "saved ranks are in different epochs; each continues its own epoch at this world size, "
            "there is no common plan to show"
        )
    return ResumePlan(first.epoch, first.plan, first.layout, tuple(r.batches_consumed for r in resumes))


def resume_rank(saved: SavedStates, world_size: int, batch_size: int, rank: int) -> RankResume:
    """Where rank `rank` of `world_size` continues. Needs only its own entry when the world
    size and batch size are unchanged, every saved rank's entry otherwise."""
    return _Resumer(saved, world_size, batch_size).rank(rank)


class _Resumer:
    """Resumes any rank of one new job; the re-partitioning is computed once for all."""

    def __init__(self, saved: SavedStates, world_size: int, batch_size: int) -> None:
        self.saved = saved
        self.world_size = world_size
        self.batch_size = batch_size
        any_state = saved.any
        self.mode = TailMode.of(bool(any_state.drop_last), bool(any_state.even_batches))
        self.length = any_state.dataset_length
        # A custom sampler resumes by its own count of indices, whatever the batch size.
        own_order = Sampling(any_state.sampling) is Sampling.EPOCH_ORDER
        self.unchanged = world_size == any_state.world_size and (batch_size == any_state.batch_size or not own_order)
        # Batches delivered beyond a rank's prefix (in_order=False) leave holes that only a
        # re-planned stream can serve: such a state is re-partitioned at any world size.
        self.unchanged = self.unchanged and not saved.delivered
        self._saved_plan: Plan | None = None
        self._remapped: RankResume | None = None

    def rank(self, rank: int) -> RankResume:
        if not self.unchanged:
            if self._remapped is None:
                self._remapped = self._remap()
            return self._remapped
        saved = self.saved
        if rank not in saved.ranks:
            saved.require_complete(f"resuming rank {rank}")
        state = saved.ranks[rank]
        plan = self._plan_of(state.epoch)
        layout = Layout(plan.length, self.world_size, self.batch_size, self.mode)
        _check_progress(state, layout)
        return RankResume(state.epoch, plan, layout, state.batches_consumed, state.samples_consumed, False)

    def _remap(self) -> RankResume:
        saved, world_size, batch_size = self.saved, self.world_size, self.batch_size
        any_state = saved.any
        if Sampling(any_state.sampling) is not Sampling.EPOCH_ORDER:
            raise ResumeStateError(
                f"loader state was saved at world size {any_state.world_size} with a custom sampler or "
                f"batch_sampler; resuming at world size {world_size} needs the loader's own sampling "
                "(a custom sampler's indices cannot be re-partitioned over ranks)"
            )
        resuming = f"at world size {world_size}, batch size {batch_size}"
        if saved.delivered:
            resuming = f"batches delivered out of order (in_order=False) {resuming}"
        epoch = saved.one_epoch(resuming, f"world size {any_state.world_size}, batch size {any_state.batch_size}",
                                "world size or batch size")
        plan = self._plan_of(epoch)
        old_layout = Layout(plan.length, any_state.world_size, any_state.batch_size, self.mode)
        for state in saved.ranks.values():
            _check_progress(state, old_layout)
        consumed = [saved.ranks[r].batches_consumed for r in range(any_state.world_size)]
        holes = []
        for rank, delivered in saved.delivered.items():
            if delivered.frontier > old_layout.num_batches(rank):
                raise ResumeStateError(
                    f"loader state of rank {rank} is impossible: batch {delivered.frontier - 1} delivered "
                    f"of an epoch that has {old_layout.num_batches(rank)}"
                )
            consumed[rank] = delivered.frontier
            holes += [(batch, rank) for batch in delivered.holes]
        new_plan = plan.after(old_layout, consumed, tuple((rank, batch) for batch, rank in sorted(holes)))
        return RankResume(epoch, new_plan, Layout(new_plan.length, world_size, batch_size, self.mode), 0, 0, True)

    def _plan_of(self, epoch: int) -> Plan:
        if self._saved_plan is None:
            try:
                self._saved_plan = Plan.decode(self.saved.plan_values, self.length, self.mode, epoch)
            except ValueError as error:
                raise ResumeStateError(f"loader state's elastic plan is invalid: {error}") from None
        plan = self._saved_plan
        return plan if plan.epoch == epoch and plan.levels else Plan(self.length, self.mode, epoch)


def _check_progress(state, layout: Layout) -> None:
    if state.sampling != Sampling.EPOCH_ORDER:
        return
    available = layout.num_batches(state.rank)
    if state.batches_consumed > available:
        raise ResumeStateError(
            f"loader state of rank {state.rank} is impossible: {state.batches_consumed} batches consumed "
            f"of an epoch that has {available}"
        )
    if state.epoch_finished and state.batches_consumed != available:
        raise ResumeStateError(
            f"loader state of rank {state.rank} is impossible: its epoch is finished after "
            f"{state.batches_consumed} of {available} batches"
        )
    expected = layout.slots_before(state.rank, state.batches_consumed)
    if state.samples_consumed != expected:
        raise ResumeStateError(
            f"loader state of rank {state.rank} is impossible: {state.batches_consumed} batches "
            f"hold {expected} samples, the state says {state.samples_consumed}"
        )
