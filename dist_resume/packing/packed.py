"""`packed`: a `ShardedStream` of tokenized documents as a `ShardedStream` of packed
sequences (`PackedStream`), which also knows each shard's real tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.packing.reader import PackedDocuments
from dist_resume.packing.token_counts import DocumentTokens
from dist_resume.streams.sharded import ShardedStream


class PackedStream(ShardedStream):
    """A `ShardedStream` whose reader is `PackedDocuments` (what `packed` returns): every
    stream guarantee holds for its sequences; `shard_tokens()` is each shard's real tokens."""

    def __init__(self, shards: Sequence[str], reader: PackedDocuments, *, tokens: Sequence[int] | None = None,
                 **options: Any) -> None:
        if tokens is not None:
            if isinstance(tokens, (str, bytes)) or len(tokens) != len(shards):
                raise ValueError(f"tokens must hold one real token count per shard ({len(shards)})")
            tokens = [checked_int(f"tokens[{i}]", count, 0, INT64_LIMIT) for i, count in enumerate(tokens)]
        super().__init__(shards, reader, **options)
        self._tokens = tokens

    def shard_tokens(self) -> list[int]:
        """Every shard's real tokens (its documents' tokens): given (`tokens=`), or counted
        once, when first asked, as the stream counts its items (`lengths`): each rank of a
        job counts its share and the ranks exchange the counts, so every rank must ask."""
        if self._tokens is None:
            counter = ShardedStream(self.shards, DocumentTokens(self.reader), shuffle=False,
                                    storage_options=dict(self.storage_options))
            self._tokens = counter.lengths()
        return self._tokens


def packed(stream: ShardedStream, seq_len: int, *, mode: str = "concat", pad_id: int = 0, field: str | None = None,
           window: int | None = None, lengths: Sequence[int] | None = None,
           tokens: Sequence[int] | None = None) -> PackedStream:
    """The sequences of `seq_len + 1` tokens that `stream`'s documents pack into, as a
    `ShardedStream` over the same shards, with the same `shuffle`, `seed`,
    `storage_options` and `canonical_streams` (see `PackedDocuments` for `mode`, `pad_id`
    and `field`). Each shard is packed on its own, so the packed stream is an ordinary
    `ShardedStream` of sequences: through `ResumableDataLoader` it keeps every stream
    guarantee (exact and elastic resume, every sequence once per epoch, the same global
    batches at every world size and `num_workers`, a state of a few integers whatever
    `seq_len`), and a resume re-reads at most the shard each canonical stream stands in.

    `window`: sequences per shuffled block (default: `stream`'s); a worker holds a block of
    each canonical stream it reads, `(seq_len + 1) x 16` bytes a sequence. `lengths`: each
    shard's number of sequences, if known (else counted once from the documents' lengths,
    as a stream counts items; the document counts `stream` may have been given are not
    sequence counts). `tokens`: each shard's real tokens (its documents' tokens), if known
    (else counted once when a `Mixture` whose weights count tokens needs them). `stream` must have no `transform` (it
    would apply to documents, which the packed stream does not hand on): give the
    transform to `packed`'s result."""
    if not isinstance(stream, ShardedStream):
        raise TypeError(f"packed() takes a ShardedStream of tokenized documents, got {type(stream).__name__}: pack "
                        "each source of a Mixture (Mixture({name: packed(stream, seq_len), ...}, weights)); token "
                        "files are read as sequences by TokenSequences")
    if stream.transform is not None:
        raise ValueError("packed() takes a ShardedStream without transform: a transform of documents has no place in "
                         "a stream of packed sequences (set one on the packed stream instead: it gets sequences)")
    reader = PackedDocuments(stream.reader, seq_len, mode=mode, pad_id=pad_id, field=field)
    return PackedStream(stream.shards, reader, tokens=tokens, shuffle=stream.shuffle,
                        window=stream.window if window is None else window, seed=stream.seed,
                        storage_options=dict(stream.storage_options), canonical_streams=stream.canonical_streams,
                        lengths=lengths)
