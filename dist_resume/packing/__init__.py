"""Packed token sequences for language-model pretraining: tokenized documents packed into
fixed-length sequences, exact and elastic. `packed` turns a `ShardedStream` of documents
into one of sequences (each shard packed on its own by the `PackedDocuments` reader, so
every stream guarantee holds unchanged); `TokenSequences` reads memory-mapped token files
(`TokenFile`: numpy, raw, Megatron-LM's `.bin`/`.idx`) as a map-style dataset of
sequences; `collate_packed` batches both for a model. Imports `streams`, `positions`,
`state`, `randomness` and `arguments`; never `mixtures` or the loader."""

from dist_resume.packing.collate import PackedCollate, collate_packed
from dist_resume.packing.packed import PackedStream, packed
from dist_resume.packing.reader import PackedDocuments
from dist_resume.packing.sources import sequence_length
from dist_resume.packing.stream_padding import padded_places
from dist_resume.packing.token_files import TokenFile
from dist_resume.packing.token_sequences import TokenSequences

__all__ = ["PackedCollate", "PackedDocuments", "PackedStream", "TokenFile", "TokenSequences", "collate_packed",
           "packed", "padded_places", "sequence_length"]
