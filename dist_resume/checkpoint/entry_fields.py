"""Every field a saved rank entry of a data loader may hold, declared by who reads it at a
load: every rank (`SHARED_FIELDS`, which the save's rank table carries) or only the rank
that saved it (`OWN_FIELDS`, read whole from its own entry). An elastic load reads the
table and its own entry only, so a field in neither list would be lost without a word at
a resume at another world size: a save that meets one is refused before anything is
written (`check_entry_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from dist_resume.errors import CheckpointError
from dist_resume.randomness.sampler import SAMPLER_RNG_KEY
from dist_resume.state.delivered import DELIVERED_KEY
from dist_resume.state.fields import (DATASET_KEY, ELASTIC_GUARD_KEY, MAX_WORLD_SIZE, PROGRESS_KEY, SAMPLER_KEY,
                                      ResumeStateError, rank_of)
from dist_resume.state.skips import SKIPS_KEY
from dist_resume.streams.cursor import STREAM_KEY
from dist_resume.streams.stream_state import CANONICAL, ITEMS, META, OF_ITERATOR, SNAPSHOT_PREFIX
from dist_resume.streams.unordered_records import RUNS_KEY, UNORDERED

Path = tuple[str, ...]

# Read of every saved rank (a resume at another world size re-partitions from them); each a
# 1-D int64 tensor. New fields go at the end: a saved table names each column by its path.
SHARED_FIELDS: tuple[Path, ...] = (
    (PROGRESS_KEY,), (DELIVERED_KEY,), (SKIPS_KEY,), (STREAM_KEY, META), (STREAM_KEY, CANONICAL),
    (STREAM_KEY, UNORDERED), (STREAM_KEY, RUNS_KEY))
# Read only by the rank that saved them, at the saved world size (a user sampler's state, the
# sampler's generator, a stateful dataset's and an IterableDataset's per-role snapshots and
# items since): whatever they hold.
_ROLE = "<role>"  # stands for the role number of a snapshot field
OWN_FIELDS: tuple[Path, ...] = (
    (SAMPLER_KEY,), (SAMPLER_RNG_KEY,), (DATASET_KEY,), (STREAM_KEY, ITEMS), (STREAM_KEY, OF_ITERATOR),
    (STREAM_KEY, f"{SNAPSHOT_PREFIX}{_ROLE}"))
# Mappings whose fields are declared one by one.
_GROUPS = {path[:-1] for path in SHARED_FIELDS + OWN_FIELDS if len(path) > 1}


def check_entry_fields(state: Mapping[str, Any]) -> None:
    """Refuse (one :class:`CheckpointError`) a data loader state in ``state`` (a save's
    state dicts, by key) whose world size is impossible, whose rank entries are named like
    no rank's, or hold a field declared neither shared nor own, or a shared field that is
    not a 1-D int64 tensor."""
    for key, loader in state.items():
        if not (isinstance(loader, Mapping) and ELASTIC_GUARD_KEY in loader):
            continue
        guard = loader[ELASTIC_GUARD_KEY]
        saved = guard.shape[0] if isinstance(guard, torch.Tensor) and guard.dim() else 0
        if not 0 < saved <= MAX_WORLD_SIZE:
            raise CheckpointError(f"data loader state {key!r} says world size {saved}, outside 1 to {MAX_WORLD_SIZE}")
        for name, entry in loader.items():
            try:
                rank = rank_of(name)
            except ResumeStateError as exc:
                raise CheckpointError(f"data loader state {key!r}: {exc}") from None
            if rank is not None and isinstance(entry, Mapping):
                _check(entry, (), f"{key}.{name}")


def _check(fields: Mapping[str, Any], group: Path, where: str) -> None:
    for name, value in fields.items():
        path = (*group, _declared_name(name, group))
        shown = ".".join((where, *group, str(name)))
        if path in SHARED_FIELDS:
            if not (isinstance(value, torch.Tensor) and value.dtype == torch.int64 and value.dim() == 1):
                raise CheckpointError(f"data loader field {shown!r} is shared by every rank's load "
                                      "but is not a 1-D int64 tensor; this is a dist_resume bug, please report it")
        elif path in _GROUPS and isinstance(value, Mapping):
            _check(value, path, where)
        elif path not in OWN_FIELDS:
            raise CheckpointError(
                f"data loader field {shown!r} is declared neither shared by every rank's load nor "
                "read by its own rank only (dist_resume.checkpoint.entry_fields), so a load at another world size "
                "would lose it; this is a dist_resume bug, please report it")


def _declared_name(name: Any, group: Path) -> Any:
    """``name`` as the declarations spell it: a snapshot field of a stream with its role as `_ROLE`."""
    if group == (STREAM_KEY,) and isinstance(name, str) and name.startswith(SNAPSHOT_PREFIX) \
            and name[len(SNAPSHOT_PREFIX):].isdigit():
        return f"{SNAPSHOT_PREFIX}{_ROLE}"
    return name
