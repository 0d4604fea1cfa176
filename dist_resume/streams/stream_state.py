"""Checking a saved stream state before a loader continues from it (G6).

A stream entry of rank `r` is ``{"meta": int64[kind, num_workers, last role, digest], ...}``
and, for a `ShardedStream`, ``"consumed"`` and ``"finished"``: int64[shards]; for any
other IterableDataset, ``"items"``: int64[roles] and optional ``"snapshot_<role>"``.
Every field that does not fit gives one ResumeStateError naming it; nothing is skipped
or repeated silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from dist_resume.state.fields import MAX_WORLD_SIZE, ResumeStateError

META = "meta"
SNAPSHOT_KIND, SHARD_KIND = 0, 1
KIND_WORDS = {SNAPSHOT_KIND: "an IterableDataset", SHARD_KIND: "a ShardedStream"}


class StreamMeta(NamedTuple):
    kind: int
    num_workers: int
    last_role: int
    digest: int


def int_list(entry: Mapping[str, Any], name: str, where: str, length: int) -> list[int]:
    """Field ``name`` of ``entry``: a 1-D int64 tensor of ``length`` values, as a list."""
    if name not in entry:
        raise ResumeStateError(f"{where} has no {name!r}")
    value = entry[name]
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.dim() != 1:
        raise ResumeStateError(f"{where} field {name!r} is not a 1-D int64 tensor")
    if len(value) != length:
        raise ResumeStateError(f"{where} field {name!r} has {len(value)} values, expected {length}")
    return value.tolist()


def read_meta(entry: Mapping[str, Any], where: str) -> StreamMeta:
    kind, num_workers, last_role, digest = int_list(entry, META, where, 4)
    if kind not in KIND_WORDS:
        raise ResumeStateError(f"{where} field {META!r} names unknown stream kind {kind}")
    if not 0 <= num_workers <= MAX_WORLD_SIZE:
        raise ResumeStateError(f"{where} field {META!r} has num_workers {num_workers}")
    if not -1 <= last_role < max(num_workers, 1):
        raise ResumeStateError(f"{where} field {META!r} has last role {last_role} of {max(num_workers, 1)}")
    return StreamMeta(kind, num_workers, last_role, digest)


def shard_counts(entry: Mapping[str, Any], where: str, shards: int) -> tuple[list[int], list[int]]:
    """``consumed`` (>= 0 items) and ``finished`` (0 or 1) of each of ``shards`` shards."""
    consumed = int_list(entry, "consumed", where, shards)
    finished = int_list(entry, "finished", where, shards)
    for shard, count in enumerate(consumed):
        if count < 0:
            raise ResumeStateError(f"{where} field 'consumed' is {count} for shard {shard}")
    for shard, flag in enumerate(finished):
        if flag not in (0, 1):
            raise ResumeStateError(f"{where} field 'finished' is {flag} for shard {shard} (0 or 1)")
    return consumed, finished


def role_items(entry: Mapping[str, Any], where: str, roles: int) -> list[int]:
    """``items`` (>= 0) each of ``roles`` worker roles yielded since its snapshot."""
    items = int_list(entry, "items", where, roles)
    for role, count in enumerate(items):
        if count < 0:
            raise ResumeStateError(f"{where} field 'items' is {count} for role {role}")
    return items
