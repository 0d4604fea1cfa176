"""A loaded loader state dict, decoded and checked: every rank entry it holds, their
agreement with each other, and with the loader that continues them (G5, G6). A field that
does not fit is one ResumeStateError naming it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import torch

from dist_resume.state.delivered import DELIVERED_KEY, Delivered
from dist_resume.state.fields import (
    MAX_WORLD_SIZE,
    PLAN_KEY,
    PROGRESS_KEY,
    SAMPLER_KEY,
    Identity,
    RankState,
    ResumeStateError,
    STEP_LIMIT,
    UNKNOWN_STEP,
    Sampling,
    plan_digest,
    rank_of,
)


@dataclass
class SavedStates:
    """Every rank entry found in a loaded state dict, checked against each other."""

    ranks: dict[int, RankState]
    plan_values: list[int]
    sampler_states: dict[int, Any]
    # Ranks that delivered batches beyond their consumed prefix (in_order=False).
    delivered: dict[int, Delivered] = field(default_factory=dict)

    @property
    def any(self) -> RankState:
        return next(iter(self.ranks.values()))

    @property
    def complete(self) -> bool:
        return len(self.ranks) == self.any.world_size

    def require_complete(self, why: str) -> None:
        world_size = self.any.world_size
        missing = sorted(set(range(world_size)) - set(self.ranks))
        if missing:
            raise ResumeStateError(
                f"loader state holds ranks {sorted(self.ranks)} of a world of {world_size}, "
                f"ranks {missing} are missing: {why} needs every rank's state "
                "(use dist_resume.load_checkpoint, or merge the state_dict() of every rank)"
            )

    def one_epoch(self, resuming: str, saved_layout: str, changed: str) -> int:
        """The epoch every saved rank stopped in; a re-partitioning resume (`resuming` at
        another `changed` than `saved_layout`) needs every rank's state, all in one epoch."""
        self.require_complete(f"resuming {resuming} (saved: {saved_layout})")
        epochs = {state.epoch for state in self.ranks.values()}
        if len(epochs) > 1:
            where = ", ".join(f"rank {r} in epoch {s.epoch}" for r, s in sorted(self.ranks.items()))
            raise ResumeStateError(
                f"saved ranks stopped in different epochs ({where}); a resume at another {changed} needs "
                f"them in one epoch: resume at {saved_layout} until the epoch ends"
            )
        return epochs.pop()

    @property
    def global_step(self) -> int:
        """The global step a loader continues from: the entries' (the furthest, if they
        differ), 0 if none was recorded (a state saved before steps were)."""
        return max(0, max(state.global_step for state in self.ranks.values()))

    def require_one_save(self, sat_out: Callable[[int], int] = lambda rank: 0) -> None:
        """Every entry was taken at one global step of a lockstep job: entries of different
        saves (a rank that stopped between a training step and the save, files of two saves
        merged) are refused, naming where each rank stood. A rank that consumed its whole
        epoch may stand ``sat_out(rank)`` steps behind (the final steps it has no batch of,
        even_batches=False). Outside the loader's own epoch order (a custom sampler, a
        stream) a rank's pass may end before its peers', so there the ranks that are into
        an epoch must stand at the same batch of the same epoch, and a rank at an epoch's
        start may be behind."""
        places: dict[tuple[int, ...], list[int]] = {}
        reach = []  # per rank of the epoch order: the steps it may stand at
        for rank, state in sorted(self.ranks.items()):
            if state.sampling == Sampling.EPOCH_ORDER:
                places.setdefault((state.global_step,), []).append(rank)
                reach.append((state.global_step, state.global_step + sat_out(rank)))
            elif state.batches_consumed:
                places.setdefault((state.epoch, state.batches_consumed), []).append(rank)
        one_step = max((low for low, _ in reach), default=0) <= min((high for _, high in reach), default=0)
        if len(places) <= 1 or (one_step and len(reach) == len(self.ranks)):
            return
        listed = "; ".join(f"ranks {ranks} at {_place(place)}" for place, ranks in sorted(places.items(), reverse=True))
        raise ResumeStateError(
            f"loader state entries come from different saves ({listed}): a rank stopped between a training "
            "step and the save, or states of different saves were merged; resume from a checkpoint that every "
            "rank saved at one step (if the ranks do not train in lockstep, load with independent_ranks=True)"
        )

    def check_identity(self, identity: Identity) -> None:
        """G6: a state for another dataset, seed, shuffle or sharding mode is refused."""
        saved = self.any.identity
        if saved.dataset_length != identity.dataset_length:
            raise ResumeStateError(
                f"loader state was saved for a dataset of {saved.dataset_length} samples; "
                f"this loader's dataset has {identity.dataset_length}"
            )
        if saved.seed != identity.seed:
            raise ResumeStateError(f"loader state was saved with seed {saved.seed}; this loader has seed {identity.seed}")
        if saved.shuffle != identity.shuffle:
            raise ResumeStateError(
                f"loader state was saved with shuffle={saved.shuffle}; this loader has shuffle={identity.shuffle}"
            )
        if (saved.drop_last, saved.even_batches) != (identity.drop_last, identity.even_batches):
            raise ResumeStateError(
                f"loader state was saved with {saved.describe_mode()}; this loader has {identity.describe_mode()}"
            )
        if saved.sampling != identity.sampling:
            raise ResumeStateError(
                f"loader state was saved with sampling by {_SAMPLING_WORDS[saved.sampling]}; "
                f"this loader samples by {_SAMPLING_WORDS[identity.sampling]}"
            )
        if saved.dataset_digest != identity.dataset_digest:
            raise ResumeStateError(
                f"loader state was saved for a dataset with definition digest {saved.dataset_digest}; this "
                f"loader's has {identity.dataset_digest} (0: a plain dataset; else one that owns its order: a Mixture, "
                "of its sources and their seq_len if packed, or TokenSequences, of its seq_len and files)"
            )


def _place(place: tuple[int, ...]) -> str:
    if len(place) == 2:
        return f"batch {place[1]} of epoch {place[0]}"
    if place[0] == UNKNOWN_STEP:
        return "an unrecorded global step (saved by an older dist_resume)"
    return f"global step {place[0]}"


_SAMPLING_WORDS = {
    Sampling.EPOCH_ORDER: "the loader's own epoch order",
    Sampling.SAMPLER: "a custom sampler",
    Sampling.BATCH_SAMPLER: "a custom batch_sampler",
    Sampling.STREAM: "an IterableDataset's streams",
}

# Fields on which every rank entry of one save must agree.
_SHARED_FIELDS = (
    "dataset_length",
    "seed",
    "shuffle",
    "drop_last",
    "even_batches",
    "sampling",
    "dataset_digest",
    "world_size",
    "batch_size",
    "global_batch",
)
_shared = attrgetter(*_SHARED_FIELDS)


def decode(state_dict: Mapping[str, Any]) -> SavedStates:
    """The rank entries of a loader state dict (one rank's, or several ranks' merged)."""
    if not isinstance(state_dict, Mapping):
        raise ResumeStateError(f"loader state must be a mapping, got {type(state_dict).__name__}")
    ranks: dict[int, RankState] = {}
    samplers: dict[int, Any] = {}
    delivered: dict[int, Delivered] = {}
    for key, entry in state_dict.items():
        number = rank_of(key)
        if number is None:
            continue
        if not isinstance(entry, Mapping) or PROGRESS_KEY not in entry:
            raise ResumeStateError(f"loader state entry {key!r} has no {PROGRESS_KEY!r} tensor")
        state = RankState.from_tensor(entry[PROGRESS_KEY], key)
        if state.rank != number:
            raise ResumeStateError(f"loader state entry {key!r} says it belongs to rank {state.rank}")
        ranks[state.rank] = state
        if SAMPLER_KEY in entry:
            samplers[state.rank] = entry[SAMPLER_KEY]
        if DELIVERED_KEY in entry:
            ahead = Delivered.decode(entry[DELIVERED_KEY], key, state.batches_consumed)
            if ahead.ahead:
                delivered[state.rank] = ahead
    if not ranks:
        raise ResumeStateError("loader state has no rank entries (expected keys like 'rank_0')")
    plan = state_dict.get(PLAN_KEY)
    if not isinstance(plan, torch.Tensor) or plan.dtype != torch.int64 or plan.dim() != 1:
        raise ResumeStateError(f"loader state has no 1-D int64 {PLAN_KEY!r} tensor")
    plan_values = plan.tolist()
    first_rank = min(ranks)
    first = ranks[first_rank]
    agreed = _shared(first)
    for rank in sorted(ranks):
        state = ranks[rank]
        if _shared(state) != agreed:
            name = next(name for name in _SHARED_FIELDS if getattr(state, name) != getattr(first, name))
            raise ResumeStateError(
                f"loader state entries disagree: rank {rank} has {name}={getattr(state, name)}, "
                f"rank {first_rank} has {name}={getattr(first, name)}"
            )
        _check_counts(state)
    # The plan is fixed for the life of a job (set when it loads), so every rank of one
    # save recorded the same digest, whatever epoch it has reached.
    loaded_digest = plan_digest(plan_values)
    for rank, state in sorted(ranks.items()):
        if state.plan_digest != loaded_digest:
            raise ResumeStateError(
                f"loader state's {PLAN_KEY!r} does not match the digest rank {rank} recorded "
                "(entries from different saves mixed?)"
            )
    return SavedStates(ranks, plan_values, samplers, delivered)


def _check_counts(state: RankState) -> None:
    problems = []
    if state.world_size > MAX_WORLD_SIZE:
        problems.append(f"world size {state.world_size} above the supported {MAX_WORLD_SIZE}")
    elif not 0 <= state.rank < state.world_size:
        problems.append(f"rank {state.rank} outside world size {state.world_size}")
    if state.batch_size < 1:
        problems.append(f"batch size {state.batch_size}")
    if state.global_batch != state.world_size * state.batch_size:
        problems.append(f"global batch {state.global_batch} != {state.world_size} x {state.batch_size}")
    if state.dataset_length < 0 or state.epoch < 0:
        problems.append(f"dataset length {state.dataset_length}, epoch {state.epoch}")
    if not 0 <= state.batches_consumed <= state.samples_consumed or state.samples_consumed < 0:
        problems.append(f"{state.batches_consumed} batches but {state.samples_consumed} samples consumed")
    if not 0 <= state.seed:
        problems.append(f"seed {state.seed}")
    if not UNKNOWN_STEP <= state.global_step <= STEP_LIMIT:
        problems.append(f"global step {state.global_step} outside {UNKNOWN_STEP} to 2**62")
    for flag in ("shuffle", "drop_last", "even_batches", "epoch_finished"):
        if getattr(state, flag) not in (0, 1):
            problems.append(f"{flag} {getattr(state, flag)}")
    if problems:
        raise ResumeStateError(f"loader state of rank {state.rank} is impossible: " + "; ".join(problems))
