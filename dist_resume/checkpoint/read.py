"""Reading a committed step's files with bounded resources (G8).

Every file is read only if it is a regular file inside the checkpoint location (a FIFO,
a device or a symlink leading elsewhere is refused before it is opened for reading), and
every size or count the files declare is checked against the bytes actually stored
before anything is allocated for it. Damage gives one :class:`CheckpointCorruptError`,
a file that asks for more than plain data one :class:`UnsafeCheckpointError`.
"""

from __future__ import annotations

import io
import json
import math
import os
import posixpath
import re
import stat
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from dist_resume.errors import CheckpointCorruptError, UnsafeCheckpointError
from dist_resume.safe_load import load_stored, unpickle_metadata
from dist_resume.state import MAX_WORLD_SIZE
from dist_resume.storage import Location, retry

METADATA = ".metadata"  # DCP's name
ATTEMPT_NAME = re.compile(r"attempt_[0-9a-f]{32}")  # one save's own directory inside its step
MARKER_LIMIT = 64 * 2**10  # a commit marker is a few hundred bytes of JSON
_LATEST_TIME = 32503680000.0  # the year 3000: any later "commit time" is damage
_MAX_DIMS = 64
_MAX_PATH_DEPTH = 256


# ---------------------------------------------------------------- files

def _open_local(loc: Location, path: str, where: str) -> int:
    """A descriptor of ``path``, refused unless it is a regular file inside ``loc``."""
    name = posixpath.basename(path)
    root = os.path.realpath(loc.root)
    if os.path.commonpath([os.path.realpath(path), root]) != root:
        raise UnsafeCheckpointError(f"refused to read {where}: {name} links outside the checkpoint location")
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{where} is damaged: {name} is missing") from None
    except OSError as exc:
        raise loc.error("read", path, exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeCheckpointError(f"refused to read {where}: {name} is not a regular file")
    return fd


def file_size(loc: Location, path: str, where: str) -> int:
    """The size of the checkpoint file ``path``, refused unless it is a regular file inside ``loc``."""
    if loc.is_local:
        fd = _open_local(loc, path, where)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)
    try:
        info = retry(loc.fs.info, path)
    except FileNotFoundError:
        raise CheckpointCorruptError(f"{where} is damaged: {posixpath.basename(path)} is missing") from None
    except Exception as exc:
        raise loc.error("read", path, exc) from None
    if info.get("type") != "file":
        raise UnsafeCheckpointError(f"refused to read {where}: {posixpath.basename(path)} is not a file")
    return int(info["size"])


def read_range(loc: Location, path: str, offset: int, length: int, where: str) -> bytearray:
    """``length`` bytes of the checkpoint file ``path`` from ``offset``; all of them or an error."""
    if loc.is_local:
        data = bytearray(length)
        view, done = memoryview(data), 0
        fd = _open_local(loc, path, where)
        try:
            while done < length:
                read = os.preadv(fd, [view[done:]], offset + done)
                if not read:
                    break
                done += read
        finally:
            os.close(fd)
        del view
    elif length:
        try:
            data = bytearray(retry(loc.fs.cat_file, path, start=offset, end=offset + length))
        except Exception as exc:
            raise loc.error("read", path, exc) from None
        done = len(data)
    else:
        data, done = bytearray(), 0
    if done != length:
        raise CheckpointCorruptError(
            f"{where} is damaged: {posixpath.basename(path)} ends before byte {offset + length}"
        )
    return data


def read_whole(loc: Location, path: str, where: str, limit: int | None = None) -> bytearray:
    """The checkpoint file ``path``, refused if it holds more than ``limit`` bytes."""
    size = file_size(loc, path, where)
    if limit is not None and size > limit:
        raise CheckpointCorruptError(
            f"{where} is damaged: {posixpath.basename(path)} has {size} bytes, more than {limit}"
        )
    return read_range(loc, path, 0, size, where)


# ---------------------------------------------------------------- the commit marker

def read_marker(loc: Location, path: str, step: int, where: str) -> dict[str, Any]:
    """The commit marker ``path`` of ``step``, each field checked (see :func:`parse_marker`)."""
    return parse_marker(read_whole(loc, path, where, MARKER_LIMIT), step, where)


def parse_marker(data: bytes, step: int, where: str) -> dict[str, Any]:
    """The fields of a commit marker, each checked: ``step``, ``world_size``, ``committed_at``."""
    try:
        marker = json.loads(data, parse_constant=lambda name: float("nan"))
    except ValueError as exc:
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker is not JSON ({exc})") from None
    if not isinstance(marker, dict):
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker is not a JSON object")
    for name in ("step", "world_size", "committed_at"):
        if name not in marker:
            raise CheckpointCorruptError(f"{where} is damaged: its commit marker has no {name!r}")
    world_size, committed_at = marker["world_size"], marker["committed_at"]
    if marker["step"] != step or type(marker["step"]) is not int:
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker names step {marker['step']!r}")
    if type(world_size) is not int or not 1 <= world_size <= MAX_WORLD_SIZE:
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker has world_size {world_size!r}")
    if type(committed_at) not in (int, float) or not 0 <= committed_at <= _LATEST_TIME:
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker has committed_at {committed_at!r}")
    attempt = marker.get("attempt")  # absent in steps saved before attempts had directories
    if attempt is not None and not (isinstance(attempt, str) and ATTEMPT_NAME.fullmatch(attempt)):
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker names attempt {str(attempt)[:80]!r}")
    return marker


# ---------------------------------------------------------------- .metadata

def _ints(value: Any, what: str, where: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)) or len(value) > _MAX_DIMS or \
            any(type(n) is not int or n < 0 for n in value):
        raise CheckpointCorruptError(f"{where} is damaged: {what} {str(value)[:80]} is not a list of sizes")
    return tuple(value)


def _storage_info(metadata: Metadata, index: MetadataIndex, where: str) -> _StorageInfo:
    info = metadata.storage_data.get(index)
    if info is None:
        raise CheckpointCorruptError(f"{where} is damaged: no stored data for '{index.fqn}'")
    return info


def _check_tensor(fqn: str, entry: TensorStorageMetadata, metadata: Metadata, where: str) -> None:
    """A tensor's declared size is no larger than the data stored for its chunks."""
    dtype = getattr(entry.properties, "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointCorruptError(f"{where} is damaged: tensor '{fqn}' has no dtype")
    size = _ints(entry.size, f"the size of tensor '{fqn}'", where)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    stored = 0
    for chunk in entry.chunks:
        offsets = _ints(chunk.offsets, f"a chunk offset of '{fqn}'", where)
        sizes = _ints(chunk.sizes, f"a chunk size of '{fqn}'", where)
        if len(offsets) != len(size) or len(sizes) != len(size) or \
                any(o + n > whole for o, n, whole in zip(offsets, sizes, size)):
            raise CheckpointCorruptError(f"{where} is damaged: a chunk of tensor '{fqn}' lies outside its size")
        elements = math.prod(sizes)
        info = _storage_info(metadata, MetadataIndex(fqn, offsets), where)
        if elements * itemsize > info.length:
            raise CheckpointCorruptError(
                f"{where} is damaged: tensor '{fqn}' declares {elements * itemsize} bytes "
                f"where {info.length} are stored"
            )
        stored += elements
    if math.prod(size) > stored:
        raise CheckpointCorruptError(
            f"{where} is damaged: tensor '{fqn}' declares {math.prod(size)} elements, its chunks hold {stored}"
        )


def _check_path(fqn: str, path: Any, entries: int, where: str) -> None:
    """A planner path places a value no deeper and no further into a list than the
    checkpoint's own entries can fill."""
    if not isinstance(path, (tuple, list)) or not 1 <= len(path) <= _MAX_PATH_DEPTH or any(
            not isinstance(key, str) and (type(key) is not int or not 0 <= key < entries) for key in path):
        raise CheckpointCorruptError(f"{where} is damaged: entry '{fqn}' has the object path {str(path)[:80]}")


def check_metadata(metadata: Metadata, sizes: dict[str, int], where: str) -> None:
    """Every entry of ``metadata`` within the stored bytes: ``sizes`` maps each file the
    metadata names to its real size. Run before anything is allocated from the metadata."""
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not isinstance(metadata.storage_data, dict) or \
            not isinstance(metadata.planner_data, dict):
        raise CheckpointCorruptError(f"{where} is damaged: its metadata lacks a table")
    ranges: dict[str, list[tuple[int, int]]] = {}
    for info in metadata.storage_data.values():
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
            _check_tensor(fqn, entry, metadata, where)
        elif isinstance(entry, BytesStorageMetadata):
            _storage_info(metadata, MetadataIndex(fqn), where)
        else:
            raise CheckpointCorruptError(f"{where} is damaged: entry '{fqn}' is a {type(entry).__name__}")
        _check_path(fqn, metadata.planner_data.get(fqn), len(entries), where)


def read_metadata(loc: Location, directory: str, where: str) -> Metadata:
    """The ``.metadata`` of the step in ``directory``, checked against the real sizes of the
    files it points into before anything is allocated from it."""
    path = posixpath.join(directory, METADATA)
    metadata = unpickle_metadata(read_whole(loc, path, where), loc.url_of(path))
    check_metadata(metadata, _shard_sizes(loc, directory, shard_names(metadata, where), where), where)
    return metadata


def _shard_sizes(loc: Location, directory: str, names: set[str], where: str) -> dict[str, int]:
    """The real size of each file ``names`` in ``directory``: one listing on an object store."""
    if loc.is_local:
        return {name: file_size(loc, posixpath.join(directory, name), where) for name in sorted(names)}
    try:
        listing = retry(loc.fs.ls, directory, detail=True)
    except Exception as exc:
        raise loc.error("list", directory, exc) from None
    found = {posixpath.basename(entry["name"].rstrip("/")): entry for entry in listing}
    sizes = {}
    for name in sorted(names):
        if name not in found:
            raise CheckpointCorruptError(f"{where} is damaged: shard {name} is missing")
        if found[name].get("type") != "file":
            raise UnsafeCheckpointError(f"refused to read {where}: {name} is not a file")
        sizes[name] = int(found[name]["size"])
    return sizes


def shard_names(metadata: Metadata, where: str) -> set[str]:
    """The files ``metadata`` points into: plain names inside the step directory."""
    names = {getattr(info, "relative_path", None) for info in metadata.storage_data.values()}
    for name in names:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", ".."):
            raise UnsafeCheckpointError(f"refused to load {where}: its metadata names the file {str(name)[:80]!r}")
    return names


# ---------------------------------------------------------------- DCP's reader

class BoundedReader(StorageReader):
    """DCP storage reader for one step directory whose metadata was checked: each item is
    read as its exact byte range and unpickled by :func:`load_stored`."""

    def __init__(self, loc: Location, directory: str, metadata: Metadata, where: str) -> None:
        super().__init__()
        self._loc = loc
        self._directory = directory
        self._metadata = metadata
        self._where = where

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        pass

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return False  # never chosen by DCP on its own

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata.storage_meta is None:
            self._metadata.storage_meta = StorageMeta()
        return self._metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for item in plan.items:
            info = self._metadata.storage_data[item.storage_index]
            path = posixpath.join(self._directory, info.relative_path)
            data = read_range(self._loc, path, info.offset, info.length, self._where)
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(data))
                continue
            fqn = item.storage_index.fqn
            what = f"tensor '{fqn}' of {self._where}"
            tensor = load_stored(data, what)
            target = planner.resolve_tensor(item).detach()
            if not isinstance(tensor, torch.Tensor) or tensor.dim() != len(item.storage_offsets) or any(
                    o + n > whole for o, n, whole in zip(item.storage_offsets, item.lengths, tensor.shape)):
                raise CheckpointCorruptError(f"{what} is damaged: its stored data does not cover its chunk")
            for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                tensor = tensor.narrow(dim, offset, length)
            if tensor.shape != target.shape or tensor.dtype != self._metadata.state_dict_metadata[fqn].properties.dtype:
                raise CheckpointCorruptError(f"{what} is damaged: its stored data does not match its metadata")
            target.copy_(tensor)
            planner.commit_tensor(item, target)
        done: Future = Future()
        done.set_result(None)
        return done

