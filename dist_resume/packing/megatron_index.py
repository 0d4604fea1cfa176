"""Megatron-LM's indexed dataset (`prefix.bin` + `prefix.idx`), read without Megatron.

The `.idx` file, little-endian: the 9 bytes ``MMIDIDX\\x00\\x00``, a uint64 version (1), a
uint8 dtype code of the `.bin` tokens (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
6 float64, 7 float32, 8 uint16), a uint64 sequence count `S`, a uint64 document count
`D`, then int32 sequence lengths `[S]`, int64 byte offsets of the sequences in `.bin`
`[S]`, int64 document indices `[D]` (the first sequence of each document, from 0, the
last entry `S`), and, for multimodal data only, int8 sequence modes `[S]`. The `.bin`
file holds the sequences' tokens one after another.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
TOKEN_DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64, 8: numpy.uint16}
FLOAT_CODES = {6: "float64", 7: "float32"}
_HEADER = len(MAGIC) + 8 + 1 + 8 + 8


class MegatronIndex(NamedTuple):
    """What a `.idx` file says of its `.bin`: the tokens' dtype, how many there are, and
    the token offset where each document starts."""

    dtype: numpy.dtype
    tokens: int
    document_starts: numpy.ndarray  # int64, increasing, from 0


def read_index(path: str) -> MegatronIndex:
    """The index at `path`, every value checked: a file that is not a Megatron index of
    integer tokens, or whose sequences do not lie one after another, is a `ValueError`
    naming the file and what is wrong."""
    data = numpy.memmap(path, numpy.uint8, mode="r") if os.path.getsize(path) else numpy.empty(0, numpy.uint8)

    def fail(what: str) -> ValueError:
        return ValueError(f"{path} is not a Megatron-LM token index: {what}")

    if len(data) < _HEADER or bytes(data[:len(MAGIC)]) != MAGIC:
        raise fail(f"it does not start with {MAGIC!r}")
    version = int.from_bytes(bytes(data[9:17]), "little")
    code = int(data[17])
    sequences, documents = (int.from_bytes(bytes(data[at:at + 8]), "little") for at in (18, 26))
    if version != VERSION:
        raise fail(f"version {version}, this reader reads version {VERSION}")
    if code in FLOAT_CODES:
        raise fail(f"its tokens are {FLOAT_CODES[code]}, not integer token ids")
    if code not in TOKEN_DTYPES:
        raise fail(f"unknown dtype code {code}")
    expected = _HEADER + sequences * (4 + 8) + documents * 8
    if len(data) == expected + sequences:
        raise fail("it is multimodal (it holds sequence modes), which this reader does not read")
    if len(data) != expected:
        raise fail(f"{len(data)} bytes, where {sequences} sequences and {documents} documents take {expected}")
    lengths = numpy.frombuffer(data, numpy.int32, sequences, _HEADER).astype(numpy.int64)
    pointers = numpy.frombuffer(data, numpy.int64, sequences, _HEADER + 4 * sequences)
    first = numpy.frombuffer(data, numpy.int64, documents, _HEADER + 12 * sequences)
    dtype = numpy.dtype(TOKEN_DTYPES[code])
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths)])
    if (lengths < 0).any() or not numpy.array_equal(pointers, offsets[:-1] * dtype.itemsize):
        raise fail("its sequences do not lie one after another in the .bin file")
    if documents == 0 or first[0] != 0 or first[-1] != sequences or (numpy.diff(first) < 0).any():
        raise fail("its document indices do not run from 0 up to the sequence count")
    return MegatronIndex(dtype, int(offsets[-1]), numpy.unique(offsets[first[:-1]]))  # an empty document starts none
