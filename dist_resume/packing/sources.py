"""Which datasets hold packed sequences, and of what length."""

from __future__ import annotations

from typing import Any

from dist_resume.packing.reader import PackedDocuments
from dist_resume.packing.token_sequences import TokenSequences
from dist_resume.streams.sharded import ShardedStream


def sequence_length(source: Any) -> int | None:
    """The `seq_len` of a packed source (a `ShardedStream` read by `PackedDocuments`, as
    `packed` makes it, or `TokenSequences`); None for any other dataset."""
    if isinstance(source, ShardedStream) and isinstance(source.reader, PackedDocuments):
        return source.reader.seq_len
    if isinstance(source, TokenSequences):
        return source.seq_len
    return None
