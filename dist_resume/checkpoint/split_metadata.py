"""DCP's metadata of a save, split so that an elastic load does not read every saved rank's
entries' metadata: one file with everything but the data loaders' rank entries (their rank
table included), and one with each saved rank's entries' metadata as a record of its own,
found through an index of int64 (16 bytes per saved rank).

Both are written by the coordinator beside ``.metadata`` (which stays whole, for same-size
resumes, ``read_loader_states`` and plain ``dcp.load``) before the step is committed. A load
reads them through the same safe unpickler and the same checks against the stored bytes as
``.metadata`` (G8); a step saved without them is loaded from ``.metadata``.

Layout of ``RANK_ENTRIES`` (int64 little-endian header, then the records)::

    MAGIC, R, rank_1 .. rank_R (ascending), end_1 .. end_R, record_1 .. record_R

where record ``i`` is a pickled DCP ``Metadata`` of the fields of rank ``rank_i``'s entries
that the rank table does not carry (`entry_fields.OWN_FIELDS`: a sampler's state, a stream's
snapshots, ...) and ends ``end_i`` bytes after the header. Ranks without such fields have no
record (``R`` may be 0).
"""

from __future__ import annotations

import pickle
import posixpath
import struct
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.storage import WriteResult

from dist_resume.checkpoint.bounded_files import file_size, read_range, read_whole
from dist_resume.checkpoint.entry_fields import SHARED_FIELDS
from dist_resume.checkpoint.metadata_checks import METADATA, check_metadata, shard_sizes
from dist_resume.checkpoint.metadata_unpickler import unpickle_metadata
from dist_resume.errors import CheckpointCorruptError
from dist_resume.state.fields import MAX_WORLD_SIZE, ResumeStateError, rank_of
from dist_resume.state.rank_table import RANK_TABLE_KEY
from dist_resume.storage import Location, retry
from dist_resume.storage.dcp_files import CheckpointWriter

SHARED = ".metadata_without_rank_entries"
RANK_ENTRIES = ".metadata_of_rank_entries"
_MAGIC = 0x31444D4B4E415244  # b"DRANKMD1" read as int64 little-endian
_WORD = 8
_MAX_RECORD = 2**24  # one rank's entries' metadata: a few hundred bytes in practice


class SplitMetadataWriter(CheckpointWriter):
    """DCP's writer that, on the coordinator, also writes the split metadata files."""

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)  # fills in metadata.storage_data
        if not tabled_keys(metadata):
            return
        shared, ranks = _split(metadata)
        with self.fs.create_stream(posixpath.join(self.path, SHARED), "wb") as stream:
            pickle.dump(shared, stream)
        records = [pickle.dumps(ranks[rank]) for rank in sorted(ranks)]
        ends, at = [], 0
        for record in records:
            at += len(record)
            ends.append(at)
        header = struct.pack(f"<{2 + 2 * len(records)}q", _MAGIC, len(records), *sorted(ranks), *ends)
        with self.fs.create_stream(posixpath.join(self.path, RANK_ENTRIES), "wb") as stream:
            stream.write(header)
            for record in records:
                stream.write(record)


def tabled_keys(metadata: Metadata) -> set[str]:
    """The keys of the data loaders saved with a rank table in ``metadata`` (checked or not)."""
    paths = metadata.planner_data.values() if isinstance(metadata.planner_data, dict) else ()
    return {path[0] for path in paths if isinstance(path, (tuple, list)) and len(path) > 1
            and isinstance(path[0], str) and path[1] == RANK_TABLE_KEY}


def _saved_rank(path: Any, tabled: set[str]) -> int | None:
    """The rank whose entry of a tabled loader ``path`` (a planner path) lies in, else None
    (:class:`ResumeStateError` for an entry of a tabled loader named like no rank's)."""
    if not isinstance(path, (tuple, list)) or len(path) < 3 or not isinstance(path[0], str) or path[0] not in tabled:
        return None
    return rank_of(path[1])


def _split(metadata: Metadata) -> tuple[Metadata, dict[int, Metadata]]:
    """``metadata`` without the tabled loaders' rank entries, and the entries' own fields
    (those the rank table does not carry) by saved rank."""
    tabled = tabled_keys(metadata)
    shared = Metadata({}, {}, {}, metadata.storage_meta, metadata.version)
    ranks: dict[int, Metadata] = {}
    stored = {(index.fqn, index.offset): (index, info) for index, info in metadata.storage_data.items()}
    for fqn, entry in metadata.state_dict_metadata.items():
        path = metadata.planner_data[fqn]
        rank = _saved_rank(path, tabled)
        if rank is not None and tuple(path[2:]) in SHARED_FIELDS:
            continue  # in the rank table
        into = shared if rank is None else ranks.setdefault(rank, Metadata({}, {}, {}, None, metadata.version))
        into.state_dict_metadata[fqn] = entry
        into.planner_data[fqn] = path
        offsets = [tuple(chunk.offsets) for chunk in entry.chunks] if hasattr(entry, "chunks") else [None]
        for offset in offsets:
            index, info = stored[fqn, offset]
            into.storage_data[index] = info
    return shared, ranks


def read_shared(loc: Location, directory: str, where: str, every_entry: set[str]) -> Metadata | None:
    """The step's metadata without its loaders' rank entries, checked (G8); None for a step
    saved without split metadata, or if a loader under a key of ``every_entry`` is to receive
    every saved rank's entries (which only ``.metadata`` lists)."""
    path = posixpath.join(directory, SHARED)
    if not _exists(loc, path):
        return None
    # not read here, but by read_loader_states, `dist-resume inspect` and plain dcp.load: a step
    # that lost it is damaged, and is reported so now rather than when one of them needs it
    file_size(loc, posixpath.join(directory, METADATA), where)
    shared = unpickle_metadata(read_whole(loc, path, where), loc.url_of(path))
    if tabled_keys(shared) & every_entry:
        return None
    return _checked(loc, directory, shared, where)


def with_rank_entries(loc: Location, directory: str, shared: Metadata, ranks: set[int], where: str) -> Metadata:
    """``shared`` (of `read_shared`) with the saved entries of ``ranks`` (those saved), checked (G8)."""
    path = posixpath.join(directory, RANK_ENTRIES)
    size = file_size(loc, path, where)
    magic, count = _words(loc, path, 0, 2, size, where)
    if magic != _MAGIC or not 0 <= count <= MAX_WORLD_SIZE:
        raise CheckpointCorruptError(f"{where} is damaged: {RANK_ENTRIES} has no valid header")
    words = _words(loc, path, 2 * _WORD, 2 * count, size, where)
    saved, ends = words[:count], words[count:]
    start = (2 + 2 * count) * _WORD
    if any(b <= a for a, b in zip(saved, saved[1:])) or any(b < a for a, b in zip((0, *ends), ends)) or \
            start + (ends[-1] if count else 0) != size:
        raise CheckpointCorruptError(f"{where} is damaged: the index of {RANK_ENTRIES} does not match its records")
    merged = Metadata(dict(shared.state_dict_metadata), dict(shared.planner_data), dict(shared.storage_data),
                      shared.storage_meta, shared.version)
    tabled = tabled_keys(shared)
    position = {rank: index for index, rank in enumerate(saved)}
    for rank in sorted(ranks & position.keys()):
        index = position[rank]
        begin = ends[index - 1] if index else 0
        if ends[index] - begin > _MAX_RECORD:
            raise CheckpointCorruptError(f"{where} is damaged: rank {rank}'s record in {RANK_ENTRIES} is too long")
        record = unpickle_metadata(read_range(loc, path, start + begin, ends[index] - begin, where), loc.url_of(path))
        entries, paths, stored = _own_record(record, rank, tabled, where)
        merged.state_dict_metadata.update(entries)
        merged.planner_data.update(paths)
        merged.storage_data.update(stored)
    return _checked(loc, directory, merged, where)


def _own_record(record: Metadata, rank: int, tabled: set[str], where: str) -> tuple[dict, dict, dict]:
    """The entries, planner paths and stored data of ``rank``'s record: refused unless they
    are that rank's entries of tabled loaders, and the data of those entries only."""
    try:
        entries, paths, stored = (getattr(record, name, None)
                                  for name in ("state_dict_metadata", "planner_data", "storage_data"))
        fqns = entries.keys() if isinstance(entries, dict) else None
        if fqns is not None and isinstance(paths, dict) and isinstance(stored, dict) and paths.keys() == fqns and \
                all(_saved_rank(place, tabled) == rank for place in paths.values()) and \
                all(getattr(index, "fqn", None) in fqns for index in stored):
            return entries, paths, stored
    except TypeError:  # an unhashable name
        pass
    raise CheckpointCorruptError(f"{where} is damaged: rank {rank}'s record in {RANK_ENTRIES} holds other entries "
                                 "than that rank's")


def _words(loc: Location, path: str, offset: int, count: int, size: int, where: str) -> tuple[int, ...]:
    """``count`` int64 of ``RANK_ENTRIES`` from byte ``offset``, refused past its ``size``."""
    if offset + count * _WORD > size:
        raise CheckpointCorruptError(f"{where} is damaged: {RANK_ENTRIES} is cut short")
    return struct.unpack(f"<{count}q", read_range(loc, path, offset, count * _WORD, where))


def _checked(loc: Location, directory: str, metadata: Metadata, where: str) -> Metadata:
    check_metadata(metadata, shard_sizes(loc, directory, metadata, where), where)
    return metadata


def _exists(loc: Location, path: str) -> bool:
    try:
        return bool(retry(loc.fs.exists, path))
    except Exception as exc:
        raise loc.error("read", path, exc) from None
