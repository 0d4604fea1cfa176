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
from dist_resume.streams.stream_state import UNORDERED_KIND, read_meta, read_position
from dist_resume.streams.unordered_pass import past_consumed
from dist_resume.streams.unordered_records import saved_pass


@dataclass(frozen=True)
class SourceProgress:
    """Draws of one source before a run position: `draws` in total, which is source-epoch
    `epoch` (`draws // length`) with `within` (`draws % length`) of its samples read; when
    the weights count tokens, `tokens`: the real tokens of those draws (None otherwise)."""

    name: str
    length: int
    draws: int
    tokens: int | None = None

    @property
    def epoch(self) -> int:
        return self.draws // self.length

    @property
    def within(self) -> int:
        return self.draws % self.length


def source_progress(definition: Definition, schedule: Schedule, position: int) -> dict[str, SourceProgress]:
    """Per source name, its draws among run positions `[0, position)`."""
    draws = schedule.draws_before(position)
    tokens = [source.before_one(count) for source, count in zip(schedule.draws, draws)] if schedule.counts_tokens \
        else [None] * len(draws)
    return {name: SourceProgress(name, length, count, real)
            for name, length, count, real in zip(definition.names, definition.lengths, draws, tokens)}


def order_of(saved: SavedStates, state_dict: Mapping[str, Any]) -> tuple[int, bool, int | None]:
    """The loader's seed, shuffle and canonical stream count (None: no stream) that a loader
    state was saved with: the order its Mixture's draws were read in."""
    first = saved.any
    canonical_streams = None
    if Sampling(first.sampling) is Sampling.STREAM:
        rank = next(iter(saved.ranks))
        entry = _stream_entry(state_dict, rank)
        in_order = read_meta(entry, _where(rank)).kind != UNORDERED_KIND
        canonical_streams = read_position(entry, _where(rank)).canonical_streams if in_order else 1
    return first.seed, bool(first.shuffle), canonical_streams


def frontier(saved: SavedStates, state_dict: Mapping[str, Any]) -> int:
    """The run position (`epoch * epoch_length + p`) past every position that the saved
    ranks, and the jobs before them, consumed, rounded up to the global step: every
    position from it on is unconsumed. With every rank's entry it covers the whole job;
    ranks that stopped after the same step (as DDP keeps them) give exact counts.
    `state_dict`: the loader state `saved` was decoded from (a Mixture of streams keeps its
    epoch position in each rank's stream entry)."""
    first = saved.any
    if Sampling(first.sampling) is Sampling.STREAM:
        entries = {rank: _stream_entry(state_dict, rank) for rank in saved.ranks}
        meta = read_meta(next(iter(entries.values())), _where(next(iter(entries))))
        if meta.kind == UNORDERED_KIND:
            return first.epoch * first.dataset_length + _unordered_position(entries, saved, max(meta.num_workers, 1))
        return max(state.epoch * first.dataset_length + read_position(entries[rank], _where(rank)).position
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


def _stream_entry(state_dict: Mapping[str, Any], rank: int) -> Mapping[str, Any]:
    entry = state_dict[rank_key(rank)].get(STREAM_KEY)
    if not isinstance(entry, Mapping):
        raise ResumeStateError(f"{_where(rank)} is missing: a Mixture of streams keeps its position there")
    return entry


def _unordered_position(entries: Mapping[int, Mapping[str, Any]], saved: SavedStates, roles: int) -> int:
    """The epoch position past every one that the saved ranks of a Mixture of streams read
    with in_order=False consumed: past what the rest of their pass leaves."""
    saved.require_complete("the run position of a Mixture of streams read with in_order=False")
    if len({state.epoch for state in saved.ranks.values()}) > 1:
        raise ResumeStateError("saved ranks of a Mixture of streams read with in_order=False stopped in different "
                               "epochs: its run position needs every rank in one")
    first = saved.any
    served, counts = saved_pass(entries, _where, saved, roles, TailMode.of(bool(first.drop_last),
                                                                           bool(first.even_batches)),
                                first.dataset_length)
    return past_consumed(served.leftover(counts), first.dataset_length)


def _where(rank: int) -> str:
    return f"loader state entry {rank_key(rank)!r} stream"
