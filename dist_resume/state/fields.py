"""The loader's saved state: int64 tensors, one entry per rank (G5); `saved` decodes and checks them.

Layout of `ResumableDataLoader.state_dict()` on rank `r` of a job of `N` ranks::

    {ELASTIC_GUARD_KEY: int64[N, K, 0] (no elements),  # replicated
     "plan": int64[K],                              # replicated: the elastic plan, [] if none
     "dataset_definition": int64[D],                # replicated, for a Mixture only (dataset_order)
     "rank_r": {"progress": int64[len(FIELDS)],     # this rank's own entry
                "sampler": ...,                     # a stateful user sampler's state, if any
                ...}}                               # more fields: dist_resume.checkpoint.entry_fields
"""

from __future__ import annotations

import enum
import re
from dataclasses import astuple, dataclass, fields
from typing import Any

import torch

from dist_resume.randomness.seeds import derive_seed

# Replicated zero-element tensor of shape (world_size, plan_length, 0). Plain `dcp.load`
# into a loader whose layout differs fails DCP's size check on this key, so the
# error DCP raises names the elastic entry point.
ELASTIC_GUARD_KEY = "elastic_guard__load_with_dist_resume_load_checkpoint"
PLAN_KEY = "plan"
PROGRESS_KEY = "progress"
SAMPLER_KEY = "sampler"
DATASET_KEY = "dataset"  # a stateful map-style dataset's states, per worker role
FORMAT_VERSION = 1
# Far above any job; keeps every O(world size) step of a resume (and of the CLI) bounded.
MAX_WORLD_SIZE = 2**20
RANK_PREFIX = "rank_"
FIRST_FIELDS = 17  # the fields of the first states of FORMAT_VERSION 1; later ones were appended
UNKNOWN_STEP = -1  # RankState.global_step of a state saved before the step was recorded
# Global steps a run counts: far beyond any, and a loaded count leaves room to count on in int64.
STEP_LIMIT = 2**62
_INT64 = range(-(2**63), 2**63)


class ResumeStateError(ValueError):
    """A loader state that cannot be resumed by this loader, with the reason."""


class Sampling(enum.IntEnum):
    """Where a loader's indices come from."""

    EPOCH_ORDER = 0  # the loader's own (seed, epoch) order, sharded over ranks
    SAMPLER = 1  # a user sampler, batched by the loader
    BATCH_SAMPLER = 2  # a user batch sampler
    STREAM = 3  # an IterableDataset: the workers' streams


@dataclass(frozen=True)
class Identity:
    """What a state must share with the loader that loads it."""

    dataset_length: int
    seed: int
    shuffle: bool
    drop_last: bool
    even_batches: bool
    sampling: Sampling
    dataset_digest: int = 0  # what a dataset that owns its order indexes (dist_resume.positions.dataset_order)

    def describe_mode(self) -> str:
        return f"drop_last={self.drop_last}, even_batches={self.even_batches}"


@dataclass(frozen=True)
class RankState:
    """One rank's progress through its current epoch."""

    version: int
    dataset_length: int
    seed: int
    shuffle: int
    drop_last: int
    even_batches: int
    sampling: int
    epoch: int
    world_size: int
    rank: int
    batch_size: int
    global_batch: int
    batches_consumed: int
    samples_consumed: int
    epoch_finished: int
    plan_digest: int
    dataset_digest: int = 0
    # Appended fields keep a default: a state saved before them holds a prefix (FIRST_FIELDS).
    # The global step of the run this rank's loader stood at (every rank of a lockstep job
    # counts alike, G6 "mixed saves"); UNKNOWN_STEP in states saved before it was recorded.
    global_step: int = UNKNOWN_STEP

    @property
    def identity(self) -> Identity:
        return Identity(
            self.dataset_length,
            self.seed,
            bool(self.shuffle),
            bool(self.drop_last),
            bool(self.even_batches),
            Sampling(self.sampling),
            self.dataset_digest,
        )

    def to_tensor(self) -> torch.Tensor:
        values = astuple(self)
        for name, value in zip(FIELDS, values):
            if value not in _INT64:  # every number is bounded where it comes in: this is a bug's last stop
                raise ValueError(f"loader state field {name} = {value} does not fit the int64 it is saved as")
        return torch.tensor(values, dtype=torch.int64)

    @classmethod
    def from_tensor(cls, values: Any, key: str) -> RankState:
        if not isinstance(values, torch.Tensor) or values.dtype != torch.int64 or values.dim() != 1:
            raise ResumeStateError(f"loader state entry {key!r} is not a 1-D int64 tensor")
        numbers = values.tolist()
        if not numbers:
            raise ResumeStateError(f"loader state entry {key!r} is empty")
        if numbers[0] != FORMAT_VERSION:
            raise ResumeStateError(
                f"loader state entry {key!r} has format version {numbers[0]}; "
                f"this dist_resume reads version {FORMAT_VERSION}"
            )
        if not FIRST_FIELDS <= len(numbers) <= len(FIELDS):
            raise ResumeStateError(
                f"loader state entry {key!r} has {len(numbers)} fields, version {FORMAT_VERSION} has {len(FIELDS)}"
            )
        state = cls(*numbers)  # fields appended since the state was saved take their defaults
        if state.sampling not in _SAMPLING_KINDS:
            raise ResumeStateError(f"loader state entry {key!r} has unknown sampling kind {state.sampling}")
        return state


FIELDS = tuple(field.name for field in fields(RankState))
_SAMPLING_KINDS = frozenset(Sampling)  # a set test: Sampling(value) per saved rank costs a lookup through enum


def plan_digest(plan_values: list[int]) -> int:
    return derive_seed(len(plan_values), *plan_values)


def rank_key(rank: int) -> str:
    return f"{RANK_PREFIX}{rank}"


_RANK_NUMBER = re.compile(r"0|[1-9][0-9]{0,6}", re.ASCII)  # as rank_key writes ranks below MAX_WORLD_SIZE


def rank_of(key: Any) -> int | None:
    """The rank whose entry ``key`` names, read the one way every reader of a loader state
    reads it: exactly as :func:`rank_key` writes it (ASCII digits, no sign, no leading zero,
    below ``MAX_WORLD_SIZE``), so that no two keys stand for one rank. None for a key that
    is not named as a rank entry (it does not start with ``rank_``); any other key that
    does is one :class:`ResumeStateError`."""
    if not (isinstance(key, str) and key.startswith(RANK_PREFIX)):
        return None
    number = key[len(RANK_PREFIX):]
    if _RANK_NUMBER.fullmatch(number) and int(number) < MAX_WORLD_SIZE:
        return int(number)
    raise ResumeStateError(f"loader state has a malformed rank key {key[:80]!r}: a rank entry is named "
                           f"'rank_<r>', r written in ASCII digits without leading zeros, below {MAX_WORLD_SIZE}")


def encode(state: RankState, plan_values: list[int], sampler_state: Any = None) -> dict[str, Any]:
    """The state dict of one rank (see the module docstring)."""
    entry: dict[str, Any] = {PROGRESS_KEY: state.to_tensor()}
    if sampler_state is not None:
        entry[SAMPLER_KEY] = sampler_state
    return {
        ELASTIC_GUARD_KEY: torch.empty((state.world_size, len(plan_values), 0), dtype=torch.int64),
        PLAN_KEY: torch.tensor(plan_values, dtype=torch.int64),
        rank_key(state.rank): entry,
    }
