"""Elastic remapping: where each rank of a new job continues, from the states of the old one.

Pure arithmetic over the saved rank entries (no process group, no communication): every
new rank computes the same plan on its own. Work and memory are O(old ranks + new ranks).
Guarantees kept (see GUARANTEES.md): G2 — every position of the epoch is consumed once
across all resumes, whatever the world sizes; G3 — positions are consumed in the same
global-step order; with an unchanged global batch and ranks that stopped after the same
step, global step k holds the same samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .layout import Layout, TailMode
from .state import ResumeStateError, SavedStates, Sampling, decode
from .stream import Plan, rank_positions


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

    def batches(self, rank: int) -> Iterator[list[int]]:
        """The positions of each batch rank `rank` consumes next (padding included)."""
        for index in range(self.consumed[rank], self.layout.num_batches(rank)):
            positions, _ = rank_positions(self.plan, self.layout, rank, index, index + 1)
            yield positions.tolist()


def plan_resume(state_dict: Mapping[str, Any], world_size: int, batch_size: int | None = None) -> ResumePlan:
    """The plan of a job of `world_size` ranks (per-rank `batch_size`, default: the saved
    one) resuming from a loader state that holds the entries of every saved rank."""
    saved = decode(state_dict)
    saved.require_complete("planning a resume")
    resumes = [resume_rank(saved, world_size, batch_size or saved.any.batch_size, rank) for rank in range(world_size)]
    first = resumes[0]
    return ResumePlan(first.epoch, first.plan, first.layout, tuple(r.batches_consumed for r in resumes))


def resume_rank(saved: SavedStates, world_size: int, batch_size: int, rank: int) -> RankResume:
    """Where rank `rank` of `world_size` continues. Needs only its own entry when the world
    size and batch size are unchanged, every saved rank's entry otherwise."""
    any_state = saved.any
    mode = TailMode.of(bool(any_state.drop_last), bool(any_state.even_batches))
    length = any_state.dataset_length
    if world_size == any_state.world_size and batch_size == any_state.batch_size:
        if rank not in saved.ranks:
            saved.require_complete(f"resuming rank {rank}")
        state = saved.ranks[rank]
        plan = _plan_of(saved, state.epoch, length, mode)
        layout = Layout(plan.length, world_size, batch_size, mode)
        _check_progress(state, layout)
        return RankResume(state.epoch, plan, layout, state.batches_consumed, state.samples_consumed, False)

    if Sampling(any_state.sampling) is not Sampling.EPOCH_ORDER:
        if world_size != any_state.world_size:
            raise ResumeStateError(
                f"loader state was saved at world size {any_state.world_size} with a custom sampler or "
                f"batch_sampler; resuming at world size {world_size} needs the loader's own sampling "
                "(a custom sampler's indices cannot be re-partitioned over ranks)"
            )
        raise ResumeStateError(
            f"loader state was saved with a custom batch_sampler of batch size {any_state.batch_size}; "
            f"this loader has batch size {batch_size}"
        )
    saved.require_complete(
        f"resuming at world size {world_size}, batch size {batch_size} "
        f"(saved: world size {any_state.world_size}, batch size {any_state.batch_size})"
    )
    epochs = {state.epoch for state in saved.ranks.values()}
    if len(epochs) > 1:
        where = ", ".join(f"rank {r} in epoch {s.epoch}" for r, s in sorted(saved.ranks.items()))
        raise ResumeStateError(
            f"saved ranks stopped in different epochs ({where}); a resume at another world size or "
            f"batch size needs them in one epoch: resume at world size {any_state.world_size}, "
            f"batch size {any_state.batch_size} until the epoch ends"
        )
    epoch = epochs.pop()
    plan = _plan_of(saved, epoch, length, mode)
    old_layout = Layout(plan.length, any_state.world_size, any_state.batch_size, mode)
    for state in saved.ranks.values():
        _check_progress(state, old_layout)
    consumed = [saved.ranks[r].batches_consumed for r in range(any_state.world_size)]
    new_plan = plan.after(old_layout, consumed)
    return RankResume(epoch, new_plan, Layout(new_plan.length, world_size, batch_size, mode), 0, 0, True)


def _plan_of(saved: SavedStates, epoch: int, length: int, mode: TailMode) -> Plan:
    try:
        plan = Plan.decode(saved.plan_values, length, mode, epoch)
    except ValueError as error:
        raise ResumeStateError(f"loader state's elastic plan is invalid: {error}") from None
    return plan if plan.epoch == epoch else Plan(length, mode, epoch)


def _check_progress(state, layout: Layout) -> None:
    if Sampling(state.sampling) is not Sampling.EPOCH_ORDER:
        return
    available = layout.num_batches(state.rank)
    if state.batches_consumed > available:
        raise ResumeStateError(
            f"loader state of rank {state.rank} is impossible: {state.batches_consumed} batches consumed "
            f"of an epoch that has {available}"
        )
    expected = layout.slots_before(state.rank, state.batches_consumed)
    if state.samples_consumed != expected:
        raise ResumeStateError(
            f"loader state of rank {state.rank} is impossible: {state.batches_consumed} batches "
            f"hold {expected} samples, the state says {state.samples_consumed}"
        )
