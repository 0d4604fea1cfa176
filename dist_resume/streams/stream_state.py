"""Checking a saved stream state before a loader continues from it (G6).

A stream entry of rank `r` is ``{"meta": int64[kind, num_workers, last role, digest], ...}``
and, for a `ShardedStream`, ``"canonical"``: int64[canonical streams, global batch, epoch
position, lengths digest, reader digest] (the same few integers at any number of shards, G5);
read with `in_order=False`, the fields of `unordered_records`;
for any other IterableDataset, ``"items"``: int64[roles] and optional ``"snapshot_<role>"``.
A `ShardedStream` state of the earlier per-shard format (``"consumed"`` and ``"finished"``
per shard) is refused with the reason.
Every field that does not fit gives one ResumeStateError naming it; nothing is skipped
or repeated silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from dist_resume.state.fields import MAX_WORLD_SIZE, ResumeStateError

META = "meta"
CANONICAL = "canonical"
ITEMS = "items"
OF_ITERATOR = "of_iterator"
SNAPSHOT_PREFIX = "snapshot_"
# 1 was the per-shard ShardedStream state of earlier versions, which nothing resumes now.
SNAPSHOT_KIND, PER_SHARD_KIND, CANONICAL_KIND, UNORDERED_KIND = 0, 1, 2, 3
KIND_WORDS = {SNAPSHOT_KIND: "an IterableDataset", PER_SHARD_KIND: "a ShardedStream of the per-shard format",
              CANONICAL_KIND: "a ShardedStream", UNORDERED_KIND: "a ShardedStream read with in_order=False"}


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
    if kind == PER_SHARD_KIND:
        raise ResumeStateError(
            f"{where} field {META!r} holds a ShardedStream state of the per-shard format (fields 'consumed' and "
            "'finished', from dist_resume before canonical streams), which this version cannot continue exactly: "
            "finish that epoch with the version that saved it, or start the epoch afresh"
        )
    return StreamMeta(kind, num_workers, last_role, digest)


class CanonicalPosition(NamedTuple):
    """Where a rank stands in a `ShardedStream`'s epoch, and what fixes its global batches."""

    canonical_streams: int
    global_batch: int
    position: int  # the epoch position this rank's next batch starts at (steps passed x global batch)
    lengths_digest: int
    reader_digest: int


CANONICAL_VALUES = len(CanonicalPosition.__annotations__)


def read_position(entry: Mapping[str, Any], where: str) -> CanonicalPosition:
    position = CanonicalPosition(*int_list(entry, CANONICAL, where, CANONICAL_VALUES))
    if not 1 <= position.canonical_streams <= MAX_WORLD_SIZE:
        raise ResumeStateError(f"{where} field {CANONICAL!r} has canonical_streams {position.canonical_streams}")
    if position.global_batch < 1:
        raise ResumeStateError(f"{where} field {CANONICAL!r} has global batch {position.global_batch}")
    if position.position < 0:
        raise ResumeStateError(f"{where} field {CANONICAL!r} has epoch position {position.position}")
    return position


def check_reader(saved_digest: int, stream: Any, where: str, field: str) -> None:
    """A `ResumeStateError` unless `saved_digest` identifies the reader of `stream` (a step
    source); it says what differs when the stream can tell (`reader_change`)."""
    if saved_digest == stream.reader_digest:
        return
    change = getattr(stream, "reader_change", lambda saved: None)(saved_digest)
    raise ResumeStateError(f"{where} field {field!r} was saved with another reader (digest {saved_digest}); this "
                           f"{stream.kind_name}'s reader has digest {stream.reader_digest}"
                           + (f": {change}" if change else ""))


def snapshot_key(role: int) -> str:
    """The field of a stream entry that holds worker role ``role``'s dataset snapshot."""
    return f"{SNAPSHOT_PREFIX}{role}"


def role_items(entry: Mapping[str, Any], where: str, roles: int) -> list[int]:
    """``items`` (>= 0) each of ``roles`` worker roles yielded since its snapshot."""
    items = int_list(entry, ITEMS, where, roles)
    for role, count in enumerate(items):
        if count < 0:
            raise ResumeStateError(f"{where} field {ITEMS!r} is {count} for role {role}")
    return items
