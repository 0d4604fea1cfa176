"""Token files for the tests of dist_resume.packing.TokenSequences: documents whose tokens
say which document they are (tests.packing_data.token), written as a numpy array with
document starts, as raw tokens ending each document with an EOS id, and as Megatron-LM's
`.bin` + `.idx` (written here from its format description, without Megatron)."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import numpy

from tests.packing_data import token

EOS = 65535
MEGATRON_CODES = {numpy.dtype(numpy.uint16): 8, numpy.dtype(numpy.int32): 4, numpy.dtype(numpy.int64): 5}


def documents(shard: int, lengths: Sequence[int]) -> list[list[int]]:
    return [[token(shard, d, j) for j in range(length)] for d, length in enumerate(lengths)]


def write_npy(path: Path, docs: list[list[int]]) -> tuple[Path, Path]:
    """`path` (.npy, int64 tokens) and `path` with `.starts.npy` (each document's first token offset)."""
    tokens = numpy.array([value for doc in docs for value in doc], dtype=numpy.int64)
    starts = numpy.cumsum([0] + [len(doc) for doc in docs[:-1]], dtype=numpy.int64)
    numpy.save(path, tokens)
    starts_path = path.with_suffix(".starts.npy")
    numpy.save(starts_path, starts)
    return path, starts_path


def write_raw_with_eos(path: Path, docs: list[list[int]], dtype: str = "uint32") -> Path:
    """Raw tokens of `dtype`, each document followed by EOS (so a document's last token is EOS)."""
    numpy.array([value for doc in docs for value in doc + [EOS]], dtype=dtype).tofile(path)
    return path


def write_megatron(prefix: Path, docs: list[list[int]], dtype=numpy.int64) -> Path:
    """`prefix.bin` and `prefix.idx` in Megatron-LM's indexed dataset format, one sequence per document."""
    dtype = numpy.dtype(dtype)
    lengths = numpy.array([len(doc) for doc in docs], dtype=numpy.int32)
    numpy.array([value for doc in docs for value in doc], dtype=dtype).tofile(f"{prefix}.bin")
    pointers = (numpy.concatenate([[0], numpy.cumsum(lengths)[:-1]]) * dtype.itemsize).astype(numpy.int64)
    document_indices = numpy.arange(len(docs) + 1, dtype=numpy.int64)
    with open(f"{prefix}.idx", "wb") as file:
        file.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", MEGATRON_CODES[dtype]))
        file.write(struct.pack("<Q", len(docs)) + struct.pack("<Q", len(document_indices)))
        file.write(lengths.tobytes() + pointers.tobytes() + document_indices.tobytes())
    return prefix
