"""DCP's ``.metadata`` of a step, unpickled safely and checked before anything is allocated
from it (G8): every size or count it declares is checked against the bytes actually stored.
Damage gives one :class:`CheckpointCorruptError`, a file that asks for more than plain data
one :class:`UnsafeCheckpointError`."""

from __future__ import annotations

import math
import posixpath
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from dist_resume.checkpoint.bounded_files import BoundedStream, file_size
from dist_resume.checkpoint.digests import require_recorded
from dist_resume.checkpoint.metadata_unpickler import unpickle_metadata
from dist_resume.errors import CheckpointCorruptError, UnsafeCheckpointError
from dist_resume.storage import Location, retry

METADATA = ".metadata"  # DCP's name
METADATA_LIMIT = 2**32  # bytes of one pickled metadata file: 22 MB at 100,000 saved ranks
# A stored tensor is its data in a torch.save archive whose own records take about 1.6 KiB.
ARCHIVE_OVERHEAD = 64 * 2**10
STORED_VALUE_LIMIT = 2**30  # bytes of one stored non-tensor value (a pickled object in an archive)
_MAX_DIMS = 64
_MAX_PATH_DEPTH = 256

def _ints(value: Any, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > _MAX_DIMS or \
            any(type(n) is not int or n < 0 for n in value):
        raise CheckpointCorruptError(f"{where} is damaged: {what} {str(value)[:80]} is not a list of sizes")
    return tuple(value)


# What `Metadata.storage_data` maps each MetadataIndex to, by the (fqn, offset) that a
# MetadataIndex compares and hashes by: looked up without making a MetadataIndex per chunk.
_Stored = dict[tuple[Any, Any], _StorageInfo]


def _storage_info(stored: _Stored, fqn: str, offsets: tuple[int, ...] | None, where: str) -> _StorageInfo:
    info = stored.get((fqn, offsets))
    if info is None:
        raise CheckpointCorruptError(f"{where} is damaged: no stored data for '{fqn}'")
    return info


def _check_tensor(fqn: str, entry: TensorStorageMetadata, data: _Stored, where: str) -> None:
    """A tensor's declared size is no larger than the data stored for its chunks."""
    dtype = getattr(entry.properties, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointCorruptError(f"{where} is damaged: tensor '{fqn}' has no dtype")
    size = _ints(entry.size, f"the size of tensor '{fqn}'", where)
    itemsize = dtype.itemsize
    stored = 0
    for chunk in entry.chunks:
        offsets = _ints(chunk.offsets, f"a chunk offset of '{fqn}'", where)
        sizes = _ints(chunk.sizes, f"a chunk size of '{fqn}'", where)
        if len(offsets) != len(size) or len(sizes) != len(size) or \
                any(o + n > whole for o, n, whole in zip(offsets, sizes, size)):
            raise CheckpointCorruptError(f"{where} is damaged: a chunk of tensor '{fqn}' lies outside its size")
        elements = math.prod(sizes)
        info = _storage_info(data, fqn, offsets, where)
        if elements * itemsize > info.length:
            raise CheckpointCorruptError(
                f"{where} is damaged: tensor '{fqn}' declares {elements * itemsize} bytes "
                f"where {info.length} are stored"
            )
        if info.length > elements * itemsize + ARCHIVE_OVERHEAD:  # read whole before it is parsed
            raise CheckpointCorruptError(f"{where} is damaged: tensor '{fqn}' is stored in {info.length} bytes, "
                                         f"more than its {elements * itemsize} bytes of data need")
        stored += elements
    if math.prod(size) > stored:
        raise CheckpointCorruptError(
            f"{where} is damaged: tensor '{fqn}' declares {math.prod(size)} elements, its chunks hold {stored}"
        )


def _check_path(fqn: str, path: Any, entries: int, where: str) -> None:
    """A planner path places a value no deeper and no further into a list than the
    checkpoint's own entries can fill, and is the path its entry's name was made from."""
    if not isinstance(path, (tuple, list)) or not 1 <= len(path) <= _MAX_PATH_DEPTH or any(
            not isinstance(key, str) and (type(key) is not int or not 0 <= key < entries) for key in path) or \
            ".".join(map(str, path)) != fqn:  # as DCP flattens a state dict
        raise CheckpointCorruptError(f"{where} is damaged: entry '{fqn}' has the object path {str(path)[:80]}")


def check_metadata(metadata: Metadata, sizes: dict[str, int], where: str) -> None:
    """Every entry of ``metadata`` within the stored bytes: ``sizes`` maps each file the
    metadata names to its real size. Run before anything is allocated from the metadata."""
    try:
        _check_entries(metadata, sizes, where)
    except (AttributeError, TypeError) as exc:  # an object unpickled without the fields its class declares
        raise CheckpointCorruptError(f"{where} is damaged: its metadata is malformed ({type(exc).__name__})") from None


def _check_entries(metadata: Metadata, sizes: dict[str, int], where: str) -> None:
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not isinstance(metadata.storage_data, dict) or \
            not isinstance(metadata.planner_data, dict):
        raise CheckpointCorruptError(f"{where} is damaged: its metadata lacks a table")
    ranges: dict[str, list[tuple[int, int]]] = {}
    stored: _Stored = {}
    for index, info in metadata.storage_data.items():
        if isinstance(index, MetadataIndex):
            stored[index.fqn, index.offset] = info
        if not isinstance(info, _StorageInfo) or info.relative_path not in sizes:
            raise CheckpointCorruptError(f"{where} is damaged: its metadata names an unknown file")
        if info.transform_descriptors:
            raise UnsafeCheckpointError(f"refused to load {where}: its data is stored through transforms")
        start, length = info.offset, info.length
        if type(start) is not int or type(length) is not int or start < 0 or length < 0:
            raise CheckpointCorruptError(f"{where} is damaged: a stored range is {start!r}+{length!r}")
        ranges.setdefault(info.relative_path, []).append((start, start + length))
    for name, spans in sorted(ranges.items()):
        spans.sort()
        if spans[-1][1] > sizes[name]:
            raise CheckpointCorruptError(
                f"{where} is damaged: shard {name} has {sizes[name]} bytes, its metadata needs {spans[-1][1]}"
            )
        if any(previous[1] > current[0] for previous, current in zip(spans, spans[1:])):
            raise CheckpointCorruptError(f"{where} is damaged: stored ranges of shard {name} overlap")
    for fqn, entry in entries.items():
        if isinstance(entry, TensorStorageMetadata):
            _check_tensor(fqn, entry, stored, where)
        elif isinstance(entry, BytesStorageMetadata):
            if _storage_info(stored, fqn, None, where).length > STORED_VALUE_LIMIT:
                raise CheckpointCorruptError(f"{where} is damaged: stored value '{fqn}' is stored in more than "
                                             f"{STORED_VALUE_LIMIT} bytes")
        else:
            raise CheckpointCorruptError(f"{where} is damaged: entry '{fqn}' is a {type(entry).__name__}")
        _check_path(fqn, metadata.planner_data.get(fqn), len(entries), where)


def read_metadata(loc: Location, directory: str, where: str, recorded: str | None = None) -> Metadata:
    """The ``.metadata`` of the step in ``directory``, checked against the digest its commit
    ``recorded`` and against the real sizes of the files it points into before anything is
    allocated from it."""
    metadata, _ = read_pickled(loc, directory, METADATA, where, recorded)
    check_metadata(metadata, shard_sizes(loc, directory, metadata, where), where)
    return metadata


def read_pickled(loc: Location, directory: str, name: str, where: str,
                 recorded: str | None = None) -> tuple[Metadata, str]:
    """The pickled metadata file ``name`` of the step in ``directory`` (streamed, unpickled
    safely, not yet checked against the shards) and the digest of its pickle, refused if it
    is not the one ``recorded``."""
    path = posixpath.join(directory, name)
    with BoundedStream(loc, path, where, METADATA_LIMIT) as stream:
        metadata = unpickle_metadata(stream, loc.url_of(path))
        stream.require_end()
        digest = stream.digest()
    require_recorded(digest, recorded, name, where)
    return metadata, digest


_ASKED_ONE_BY_ONE = 8  # files whose sizes are asked for one request each; more: one listing


def shard_sizes(loc: Location, directory: str, metadata: Metadata, where: str) -> dict[str, int]:
    """The real size of each file ``metadata`` points into in ``directory``: one request per
    file for a few (an elastic load's own entries and the rank table), one listing of the
    directory on an object store for more."""
    names = shard_names(metadata, where)
    if loc.is_local:
        return {name: file_size(loc, posixpath.join(directory, name), where) for name in sorted(names)}
    found = {name: _info(loc, posixpath.join(directory, name)) for name in names} \
        if len(names) <= _ASKED_ONE_BY_ONE else _listing(loc, directory)
    sizes = {}
    for name in sorted(names):
        if found.get(name) is None:
            raise CheckpointCorruptError(f"{where} is damaged: shard {name} is missing")
        if found[name].get("type") != "file":
            raise UnsafeCheckpointError(f"refused to read {where}: {name} is not a file")
        sizes[name] = int(found[name]["size"])
    return sizes


def _info(loc: Location, path: str) -> dict[str, Any] | None:
    try:
        return retry(loc.fs.info, path)
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise loc.error("read", path, exc) from None


def _listing(loc: Location, directory: str) -> dict[str, dict[str, Any]]:
    try:
        listing = retry(loc.fs.ls, directory, detail=True)
    except Exception as exc:
        raise loc.error("list", directory, exc) from None
    return {posixpath.basename(entry["name"].rstrip("/")): entry for entry in listing}


def shard_names(metadata: Metadata, where: str) -> set[str]:
    """The files ``metadata`` points into: plain names inside the step directory."""
    names = {getattr(info, "relative_path", None) for info in metadata.storage_data.values()}
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise UnsafeCheckpointError(f"refused to load {where}: its metadata names the file {str(name)[:80]!r}")
    return names
