"""How far a run has read each source: from a run position, or from a loader state."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dist_resume.mixtures.definition import Definition
from dist_resume.mixtures.schedule import Schedule
from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.layout import TailMode
from dist_resume.state.fields import ResumeStateError, Sampling, rank_key
from dist_resume.state.saved import SavedStates
from dist_resume.streams.cursor import STREAM_KEY
from dist_resume.streams.stream_state import read_position


@dataclass(frozen=True)
class SourceProgress:
    """Draws of one source before a run position: `draws` in total, which is source-epoch
    `epoch` (`draws // length`) with `within` (`draws % length`) of its samples read."""

    name: str
    length: int
    draws: int

    @property
    def epoch(self) -> int:
        return self.draws // self.length

    @property
    def within(self) -> int:
        return self.draws % self.length


def source_progress(definition: Definition, schedule: Schedule, position: int) -> dict[str, SourceProgress]:
    """Per source name, its draws among run positions `[0, position)`."""
    draws = schedule.draws_before(position)
    return {name: SourceProgress(name, length, count)
            for name, length, count in zip(definition.names, definition.lengths, draws)}


def frontier(saved: SavedStates, state_dict: Mapping[str, Any]) -> int:
    """The run position (`epoch * epoch_length + p`) past every position that the saved
    ranks, and the jobs before them, consumed, rounded up to the global step: every
    position from it on is unconsumed. With every rank's entry it covers the whole job;
    ranks that stopped after the same step (as DDP keeps them) give exact counts.
    `state_dict`: the loader state `saved` was decoded from (a Mixture of streams keeps its
    epoch position in each rank's stream entry)."""
    first = saved.any
    if Sampling(first.sampling) is Sampling.STREAM:
        return max(state.epoch * first.dataset_length + _stream_position(state_dict, rank)
                   for rank, state in saved.ranks.items())
    if Sampling(first.sampling) is not Sampling.EPOCH_ORDER:
        raise ResumeStateError("a Mixture's run position is known only with the loader's own order (no custom sampler)")
    mode = TailMode.of(bool(first.drop_last), bool(first.even_batches))
    length = first.dataset_length
    result = 0
    for rank, state in saved.ranks.items():
        # in_order=False: batches delivered beyond the consumed prefix were consumed too.
        batches = saved.delivered[rank].frontier if rank in saved.delivered else state.batches_consumed
        values = saved.plan_values if saved.plan_values and saved.plan_values[0] == state.epoch else []
        try:
            plan = Plan.decode(values, length, mode, state.epoch)
        except ValueError as error:
            raise ResumeStateError(f"loader state's elastic plan is invalid: {error}") from None
        slots = plan.length if state.epoch_finished else min(plan.length, batches * state.global_batch)
        result = max(result, state.epoch * length + plan.frontier(slots))
    return result


def _stream_position(state_dict: Mapping[str, Any], rank: int) -> int:
    """The epoch position a rank's next global step starts at, from its stream entry."""
    where = f"loader state entry {rank_key(rank)!r} stream"
    entry = state_dict[rank_key(rank)].get(STREAM_KEY)
    if not isinstance(entry, Mapping):
        raise ResumeStateError(f"{where} is missing: a Mixture of streams keeps its position there")
    return read_position(entry, where).position
