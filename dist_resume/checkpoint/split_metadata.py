"""DCP's metadata of a save, split so that an elastic load does not read every saved rank's
entries' metadata: one file with everything but the data loaders' rank entries (their rank
table included), and one with each saved rank's entries' metadata as a record of its own
(`rank_records`), found through an index of int64 (24 bytes per saved rank).

Both are written by the coordinator beside ``.metadata`` (which stays whole, for same-size
resumes, ``read_loader_states`` and plain ``dcp.load``) before the step is committed, and the
commit records their digests (`digests`), which every load compares. A load reads them
through the same safe unpickler and the same checks against the stored bytes as
``.metadata`` (G8); a step saved without them is loaded from ``.metadata``.
"""

from __future__ import annotations

import pickle
import posixpath
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.storage import WriteResult

from dist_resume.checkpoint.bounded_files import MissingFile, file_size
from dist_resume.checkpoint.digests import INDEX_DIGEST, METADATA_DIGEST, SHARED_DIGEST, require_recorded
from dist_resume.checkpoint.entry_fields import SHARED_FIELDS
from dist_resume.checkpoint.metadata_checks import METADATA, check_metadata, read_pickled, shard_sizes
from dist_resume.checkpoint.metadata_unpickler import unpickle_metadata
from dist_resume.checkpoint.rank_records import RANK_ENTRIES, encode_header, read_index, read_record
from dist_resume.errors import CheckpointCorruptError
from dist_resume.state.fields import ELASTIC_GUARD_KEY, ResumeStateError, rank_of
from dist_resume.state.rank_table import RANK_TABLE_KEY
from dist_resume.storage import Location, retry
from dist_resume.storage.dcp_files import CheckpointWriter

SHARED = ".metadata_without_rank_entries"


class SplitMetadataWriter(CheckpointWriter):
    """DCP's writer that, on the coordinator, also writes the split metadata files."""

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)  # fills in metadata.storage_data
        if not tabled_keys(metadata):
            return
        shared, ranks = _split(metadata)
        with self.fs.create_stream(posixpath.join(self.path, SHARED), "wb") as stream:
            pickle.dump(shared, stream)
        saved = max(saved_world_size(shared, "this save"), max(ranks, default=-1) + 1)
        records = [pickle.dumps(ranks[rank]) if rank in ranks else b"" for rank in range(saved)]
        with self.fs.create_stream(posixpath.join(self.path, RANK_ENTRIES), "wb") as stream:
            stream.write(encode_header(records))
            for record in records:
                stream.write(record)


def tabled_keys(metadata: Metadata) -> set[str]:
    """The keys of the data loaders saved with a rank table in ``metadata`` (checked or not)."""
    paths = metadata.planner_data.values() if isinstance(metadata.planner_data, dict) else ()
    return {path[0] for path in paths if isinstance(path, (tuple, list)) and len(path) > 1
            and isinstance(path[0], str) and path[1] == RANK_TABLE_KEY}


def saved_world_size(shared: Metadata, where: str) -> int:
    """The world size the tabled loaders of ``shared`` were saved at (their elastic guards'
    first dimension): the ranks that have a record."""
    sizes = set()
    for key in tabled_keys(shared):
        guard = shared.state_dict_metadata.get(f"{key}.{ELASTIC_GUARD_KEY}")
        size = getattr(guard, "size", None) if isinstance(guard, TensorStorageMetadata) else None
        if not (isinstance(size, (tuple, list)) and size and type(size[0]) is int and size[0] > 0):
            raise CheckpointCorruptError(f"{where} is damaged: the data loader under {key!r} has no elastic guard")
        sizes.add(size[0])
    return max(sizes, default=0)


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


def commit_digests(loc: Location, directory: str, where: str) -> dict[str, str]:
    """The digests of the step's metadata files as stored, read back by rank 0 before it
    commits: ``.metadata`` checked whole against every rank's shards (so that storage that
    only looks shared fails here), the split files if the save wrote them."""
    metadata, digest = read_pickled(loc, directory, METADATA, where)
    check_metadata(metadata, shard_sizes(loc, directory, metadata, where), where)
    digests = {METADATA_DIGEST: digest}
    if tabled_keys(metadata):
        digests[SHARED_DIGEST] = read_pickled(loc, directory, SHARED, where)[1]
        digests[INDEX_DIGEST] = read_index(loc, posixpath.join(directory, RANK_ENTRIES), where).digest
    return digests


def read_shared(loc: Location, directory: str, where: str, every_entry: set[str],
                recorded: dict[str, str]) -> Metadata | None:
    """The step's metadata without its loaders' rank entries, checked (G8) against the digest
    its commit ``recorded`` and the stored bytes; None for a step saved without split
    metadata, or if a loader under a key of ``every_entry`` is to receive every saved rank's
    entries (which only ``.metadata`` lists)."""
    if not _exists(loc, posixpath.join(directory, SHARED)):
        if SHARED_DIGEST in recorded:
            raise MissingFile(f"{where} is damaged: {SHARED} is missing")
        return None
    # not read here, but by read_loader_states, `dist-resume inspect` and plain dcp.load: a step
    # that lost it is damaged, and is reported so now rather than when one of them needs it
    file_size(loc, posixpath.join(directory, METADATA), where)
    shared, _ = read_pickled(loc, directory, SHARED, where, recorded.get(SHARED_DIGEST))
    tabled = tabled_keys(shared)
    if tabled & every_entry:
        return None
    try:
        named = next((path for path in shared.planner_data.values() if _saved_rank(path, tabled) is not None), None)
    except (ResumeStateError, TypeError, AttributeError):
        named = "?"
    if named is not None:
        raise CheckpointCorruptError(f"{where} is damaged: its {SHARED} holds a rank entry ({str(named)[:80]})")
    return _checked(loc, directory, shared, where)


def with_rank_entries(loc: Location, directory: str, shared: Metadata, ranks: set[int], where: str,
                      recorded: dict[str, str]) -> Metadata:
    """``shared`` (of `read_shared`) with the saved entries of ``ranks`` (those saved), checked
    (G8): each saved rank among them finds exactly its own record."""
    path = posixpath.join(directory, RANK_ENTRIES)
    index = read_index(loc, path, where)
    require_recorded(index.digest, recorded.get(INDEX_DIGEST), RANK_ENTRIES, where)
    if index.sums is not None:  # every saved rank has its record
        saved = saved_world_size(shared, where)
        if index.ranks != tuple(range(saved)):
            raise CheckpointCorruptError(f"{where} is damaged: {RANK_ENTRIES} lists ranks other than 0 to "
                                         f"{saved - 1}, the saved ranks")
    merged = Metadata(dict(shared.state_dict_metadata), dict(shared.planner_data), dict(shared.storage_data),
                      shared.storage_meta, shared.version)
    tabled = tabled_keys(shared)
    position = {rank: place for place, rank in enumerate(index.ranks)}
    for rank in sorted(ranks & position.keys()):
        record = read_record(loc, path, index, position[rank], where)
        if not record:
            continue  # this rank's entries have no field of their own
        entries, paths, stored = _own_record(unpickle_metadata(record, loc.url_of(path)), rank, tabled, where)
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
    except (TypeError, ResumeStateError):  # an unhashable name, an entry named like no rank's
        pass
    raise CheckpointCorruptError(f"{where} is damaged: rank {rank}'s record in {RANK_ENTRIES} holds other entries "
                                 "than that rank's")


def _checked(loc: Location, directory: str, metadata: Metadata, where: str) -> Metadata:
    check_metadata(metadata, shard_sizes(loc, directory, metadata, where), where)
    return metadata


def _exists(loc: Location, path: str) -> bool:
    try:
        return bool(retry(loc.fs.exists, path))
    except Exception as exc:
        raise loc.error("read", path, exc) from None
