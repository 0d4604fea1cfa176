"""Each shard's real tokens (its documents' tokens, padding excluded), learnt as a stream
learns its item counts: a `ShardedStream` over the same shards whose items are tokens."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from dist_resume.packing.documents import document_tokens
from dist_resume.packing.reader import PackedDocuments
from dist_resume.streams.reader_identity import reader_digest


@dataclass(frozen=True)
class DocumentTokens:
    """Reads a shard of the documents `packing` packs as its tokens, one item each (never
    packed: a Mixture weighing tokens reads only `count`, the shard's real tokens, through
    the stream counting machinery: split over a job's ranks, kept with the counts)."""

    packing: PackedDocuments

    @property
    def draws_randomness(self) -> bool:
        return self.packing.draws_randomness

    def __call__(self, file: BinaryIO) -> Iterator[int]:
        for number, document in enumerate(self.packing.documents(file)):
            yield from document_tokens(document, self.packing.field, number).tolist()

    def count(self, file: BinaryIO) -> int:
        return sum(len(document_tokens(document, self.packing.field, number))
                   for number, document in enumerate(self.packing.documents(file)))

    @property
    def digest(self) -> int:
        """Identifies the documents read (reader and field), not how they are packed."""
        return zlib.crc32(f"tokens:{reader_digest(self.packing.documents)}:{self.packing.field!r}".encode())
