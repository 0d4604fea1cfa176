"""`PackedDocuments`: a `ShardedStream` reader that packs each shard's tokenized documents
into fixed-length sequences, so that a stream of documents becomes a stream of sequences
with every stream guarantee (G1-G6) unchanged."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.packing.documents import document_tokens
from dist_resume.packing.packer import Packer, count_sequences
from dist_resume.packing.sequences import MODES, checked_mode
from dist_resume.streams.reader_identity import reader_digest

MAX_SEQ_LEN = 2**28 - 1  # the digest holds seq_len in 28 bits
_CONFIG_SHIFT, _SEQ_LEN_SHIFT = 30, 2


@dataclass(frozen=True)
class PackedDocuments:
    """Reads a shard with `documents(binary file) -> Iterable[document]` (each document a
    1-D sequence of int token ids: a list, numpy array or tensor; with `field`, a mapping
    whose `field` is one) and yields its sequences of `seq_len + 1` tokens (see
    `sequences`), packing the shard's documents in their order: mode "concat" concatenates
    them and cuts every `seq_len + 1` tokens (as torchtitan does); "fit" never cuts a
    document that fits a sequence (it starts the next one; the rest of the current one is
    padding), and cuts only documents longer than a sequence.

    Each shard is packed on its own: its last sequence is padded, and every token of every
    document is in exactly one sequence. `count(file)` is the shard's number of sequences,
    learnt from its documents' lengths. `digest` identifies `documents`, `seq_len`,
    `mode`, `pad_id` and `field`: a stream state saved with any of them different is
    refused (`explain_digest` names the seq_len and mode a state was saved with).
    A document that is not 1-D integers is a `ValueError` naming it and its shard."""

    documents: Callable[[BinaryIO], Iterable[Any]]
    seq_len: int
    mode: str = "concat"
    pad_id: int = 0
    field: str | None = None

    def __post_init__(self) -> None:
        if not callable(self.documents):
            raise TypeError(f"documents must be a reader of documents (callable), got {type(self.documents).__name__}")
        object.__setattr__(self, "seq_len", checked_int("seq_len", self.seq_len, 1, MAX_SEQ_LEN + 1))
        checked_mode(self.mode)
        object.__setattr__(self, "pad_id", checked_int("pad_id", self.pad_id, -INT64_LIMIT, INT64_LIMIT))
        if self.field is not None and not isinstance(self.field, str):
            raise TypeError(f"field must be a str or None, got {type(self.field).__name__}")

    @property
    def width(self) -> int:
        """Tokens per sequence: `seq_len + 1`."""
        return self.seq_len + 1

    @property
    def draws_randomness(self) -> bool:
        """Whether reading draws from the global generators: the document reader's."""
        return getattr(self.documents, "draws_randomness", True)

    def __call__(self, file: BinaryIO) -> Iterator[dict[str, Any]]:
        packer = Packer(self.width, self.mode == "fit", self.pad_id)
        for number, document in enumerate(self.documents(file)):
            yield from packer.add(document_tokens(document, self.field, number))
        yield from packer.end()

    def count(self, file: BinaryIO) -> int:
        """The shard's number of sequences (its documents read, not packed)."""
        lengths = (len(document_tokens(document, self.field, number))
                   for number, document in enumerate(self.documents(file)))
        return count_sequences(lengths, self.width, self.mode == "fit")

    @property
    def digest(self) -> int:
        return (self._configuration() << _CONFIG_SHIFT) | (self.seq_len << _SEQ_LEN_SHIFT) | MODES.index(self.mode)

    def explain_digest(self, saved: int) -> str | None:
        """What differs from the packing a state with reader digest `saved` was saved with,
        if that packing read the same documents (else None: another document reader)."""
        if saved >> _CONFIG_SHIFT != self._configuration():
            return None
        seq_len, mode = (saved >> _SEQ_LEN_SHIFT) & MAX_SEQ_LEN, saved & ((1 << _SEQ_LEN_SHIFT) - 1)
        if mode >= len(MODES) or seq_len < 1:
            return None
        return (f"the state was saved packing seq_len={seq_len}, mode={MODES[mode]!r}; this stream packs "
                f"seq_len={self.seq_len}, mode={self.mode!r}")

    def _configuration(self) -> int:
        """32 bits that identify what is packed: the document reader, `pad_id` and `field`."""
        return zlib.crc32(f"{reader_digest(self.documents)}:{self.pad_id}:{self.field!r}".encode())
