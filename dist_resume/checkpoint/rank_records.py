"""The file of each saved rank's own loader fields' metadata (`split_metadata`), read a rank's
record at a time. Layout (int64 little-endian header, then the records)::

    MAGIC_2, R, 0 .. R-1, end_1 .. end_R, sum_1 .. sum_R, record_1 .. record_R

R is the saved world size: every saved rank has exactly one record, which ends ``end_i``
bytes after the header, is empty if the rank's entries have no field of their own, and whose
digest is ``sum_i`` (`digests.record_sum`). The commit marker records the digest of the
header (`digests.INDEX_DIGEST`). Steps saved before (``MAGIC_1``, no sums, records only for
the ranks that had own fields, listed as ``MAGIC_1, R, rank_1 .. rank_R, end_1 .. end_R``)
are read as they were written.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from dist_resume.checkpoint.bounded_files import file_size, read_range
from dist_resume.checkpoint.digests import record_sum, sha256
from dist_resume.errors import CheckpointCorruptError
from dist_resume.state.fields import MAX_WORLD_SIZE
from dist_resume.storage import Location

RANK_ENTRIES = ".metadata_of_rank_entries"
MAGIC_1, MAGIC_2 = (struct.unpack("<q", name)[0] for name in (b"DRANKMD1", b"DRANKMD2"))
_WORD = 8
MAX_RECORD = 2**24  # one rank's entries' metadata: a few hundred bytes in practice


class Index(NamedTuple):
    """The header of a rank-entries file, checked against the file's size."""

    ranks: tuple[int, ...]
    ends: tuple[int, ...]
    sums: tuple[int, ...] | None  # None in files written before records had digests
    start: int  # where the records begin
    digest: str  # of the header's bytes


def encode_header(records: list[bytes]) -> bytes:
    """The header of the file holding ``records``, those of ranks 0 .. R-1."""
    ends, at = [], 0
    for record in records:
        at += len(record)
        ends.append(at)
    count, empty = len(records), record_sum(b"")  # most ranks' records are empty
    sums = [record_sum(record) if record else empty for record in records]
    return struct.pack(f"<{2 + 3 * count}q", MAGIC_2, count, *range(count), *ends, *sums)


def read_index(loc: Location, path: str, where: str) -> Index:
    """The header of the rank-entries file ``path``, each count checked against its size."""
    size = file_size(loc, path, where)
    if size < 2 * _WORD:
        raise CheckpointCorruptError(f"{where} is damaged: {RANK_ENTRIES} is cut short")
    first = read_range(loc, path, 0, 2 * _WORD, where)
    magic, count = struct.unpack("<2q", first)
    if magic not in (MAGIC_1, MAGIC_2) or not 0 <= count <= MAX_WORLD_SIZE:
        raise CheckpointCorruptError(f"{where} is damaged: {RANK_ENTRIES} has no valid header")
    columns = 3 if magic == MAGIC_2 else 2
    start = (2 + columns * count) * _WORD
    if start > size:
        raise CheckpointCorruptError(f"{where} is damaged: {RANK_ENTRIES} is cut short")
    rest = read_range(loc, path, 2 * _WORD, start - 2 * _WORD, where)
    words = struct.unpack(f"<{columns * count}q", rest)
    ranks, ends = words[:count], words[count:2 * count]
    if any(b <= a for a, b in zip(ranks, ranks[1:])) or any(b < a for a, b in zip((0, *ends), ends)) or \
            start + (ends[-1] if count else 0) != size:
        raise CheckpointCorruptError(f"{where} is damaged: the index of {RANK_ENTRIES} does not match its records")
    return Index(ranks, ends, words[2 * count:] if columns == 3 else None, start, sha256(first + rest))


def read_record(loc: Location, path: str, index: Index, position: int, where: str) -> bytearray:
    """The record at ``position`` of the file's index (rank ``index.ranks[position]``'s),
    checked against its digest."""
    rank = index.ranks[position]
    begin = index.ends[position - 1] if position else 0
    if index.ends[position] - begin > MAX_RECORD:
        raise CheckpointCorruptError(f"{where} is damaged: rank {rank}'s record in {RANK_ENTRIES} is too long")
    length = index.ends[position] - begin
    record = read_range(loc, path, index.start + begin, length, where) if length else bytearray()
    if index.sums is not None and record_sum(record) != index.sums[position]:
        raise CheckpointCorruptError(f"{where} is damaged: rank {rank}'s record in {RANK_ENTRIES} is not the one "
                                     "the save wrote")
    return record
