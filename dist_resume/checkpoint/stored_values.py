"""Stored values loaded without running code from them (G8).

DCP loads stored values with ``torch.load``; even ``weights_only=True`` admits whatever
other code registered as safe (torch.distributed registers ``DeviceMesh``, whose
constructor starts a process group). Here stored values (tensors and non-tensor values
alike) go through an unpickler that admits only tensors and plain data, with every tensor
checked against the bytes actually stored for it. A refused name is never imported.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import struct
import zipfile
import zlib
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

from dist_resume.checkpoint.nested import set_path
from dist_resume.checkpoint.torch_names import dtype_named
from dist_resume.errors import CheckpointCorruptError, UnsafeCheckpointError

_MAX_DIMS = 64


class _StorageType:
    """What a pickled storage class name stands for: only its dtype (never called)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class _Stored:
    """The bytes of one storage record, and their element type."""

    __slots__ = ("data", "dtype", "elements")

    def __init__(self, data: torch.UntypedStorage, dtype: torch.dtype, elements: int) -> None:
        self.data, self.dtype, self.elements = data, dtype, elements


# torch.save names a storage by its legacy class (torch.FloatStorage, ...); quantized ones excluded
_STORAGE_TYPES = {name: _StorageType(dtype) for dtype, name in torch.storage._dtype_to_storage_type_map().items()
                  if not name.startswith("Q")}
_STORAGE_TYPES["UntypedStorage"] = _StorageType(torch.uint8)


def _plain_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Protocol-2 pickles store bytes as ``_codecs.encode(text, 'latin1')``."""
    if not isinstance(text, str) or encoding != "latin1":
        raise UnsafeCheckpointError("'_codecs.encode' is admitted only for bytes")
    return text.encode("latin1")


def _plain_bytearray(data: Any = b"") -> bytearray:
    if not isinstance(data, (bytes, str)):  # bytearray(n) would allocate n bytes
        raise UnsafeCheckpointError("'bytearray' is admitted only from bytes")
    return bytearray(data.encode("latin1") if isinstance(data, str) else data)


def _count(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise CheckpointCorruptError(f"{what} {value!r} is not a non-negative int")
    return value


def _rebuild_tensor(storage: Any, offset: Any, size: Any, stride: Any, requires_grad: Any,
                    backward_hooks: Any, metadata: Any = None) -> torch.Tensor:
    """A tensor over loaded storage, refused unless it stays inside the stored bytes and
    views no more elements than they hold (a stride-0 view could stand for any number)."""
    if not isinstance(storage, _Stored):
        raise CheckpointCorruptError("a tensor is rebuilt from something that is not stored data")
    if not isinstance(size, tuple) or not isinstance(stride, tuple) or len(size) != len(stride) \
            or len(size) > _MAX_DIMS:
        raise CheckpointCorruptError(f"a tensor has size {size!r} and stride {stride!r}")
    offset = _count(offset, "a tensor's storage offset")
    dims = [_count(n, "a tensor dimension") for n in size]
    steps = [_count(n, "a tensor stride") for n in stride]
    elements = math.prod(dims)
    available = storage.elements
    if elements and offset + sum((n - 1) * step for n, step in zip(dims, steps)) >= available:
        raise CheckpointCorruptError(f"a tensor of size {tuple(dims)} reaches past its {available} stored elements")
    if elements > available:
        raise UnsafeCheckpointError(
            f"a tensor of size {tuple(dims)} views {elements} elements of {available} stored ones"
        )
    if backward_hooks or metadata or not isinstance(requires_grad, bool):
        raise UnsafeCheckpointError("a tensor carries hooks or metadata beyond plain data")
    tensor = torch.empty(0, dtype=storage.dtype).set_(storage.data, offset, dims, steps)
    tensor.requires_grad = requires_grad
    return tensor


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any) -> torch.Tensor:
    if not isinstance(data, torch.Tensor) or backward_hooks or not isinstance(requires_grad, bool):
        raise UnsafeCheckpointError("a parameter carries hooks or data beyond a plain tensor")
    return torch.nn.Parameter(data, requires_grad)


_STORED_GLOBALS: dict[tuple[str, str], Any] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("_codecs", "encode"): _plain_bytes,
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    **{(module, name): value for module in ("builtins", "__builtin__") for name, value in (
        ("set", set), ("frozenset", frozenset), ("complex", complex), ("slice", slice),
        ("bytearray", _plain_bytearray))},
}


def _torch_name(name: str) -> Any:
    """A dtype or a storage type named in ``torch``'s namespace, or None (looked up without
    running anything)."""
    if name in _STORAGE_TYPES:
        return _STORAGE_TYPES[name]
    return dtype_named(name)


class _View(io.RawIOBase):
    """A read-only file over a buffer, so that the archive is parsed without a copy."""

    def __init__(self, view: memoryview) -> None:
        self._view, self._position = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: len(self._view)}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._position: self._position + len(buffer)]
        buffer[: len(chunk)] = chunk
        self._position += len(chunk)
        return len(chunk)


class _Archive:
    """A torch.save archive (a zip of stored records) over a buffer; records are views
    into it, each checked against its CRC-32 (torch.load checks none)."""

    def __init__(self, data: bytearray) -> None:
        self._view = memoryview(data)
        self._zip = zipfile.ZipFile(_View(self._view))
        infos = self._zip.infolist()
        pickles = [info for info in infos if info.filename.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise CheckpointCorruptError("not a torch.save archive (no single data.pkl)")
        if any(info.compress_type != zipfile.ZIP_STORED for info in infos):
            raise UnsafeCheckpointError("the archive has compressed records")  # could inflate past the file
        self.prefix = pickles[0].filename[: -len("/data.pkl")]
        order = f"{self.prefix}/byteorder"
        if order in self._zip.namelist() and bytes(self.record(order)) != b"little":
            raise CheckpointCorruptError("the archive is not little-endian")

    def size(self, name: str) -> int | None:
        try:
            return self._zip.getinfo(name).file_size
        except KeyError:
            return None

    def record(self, name: str) -> memoryview:
        info = self._zip.getinfo(name)
        header = bytes(self._view[info.header_offset: info.header_offset + 30])
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise CheckpointCorruptError(f"record {name!r} has no header")
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + name_length + extra_length
        data = self._view[start: start + info.file_size]
        if len(data) != info.file_size or zlib.crc32(data) != info.CRC:
            raise CheckpointCorruptError(f"record {name!r} fails its CRC-32 check")
        return data


class _StoredValueUnpickler(pickle.Unpickler):
    def __init__(self, archive: _Archive) -> None:
        super().__init__(io.BytesIO(bytes(archive.record(f"{archive.prefix}/data.pkl"))))
        self._archive = archive
        self._storages: dict[str, _Stored] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _STORED_GLOBALS:
            return _STORED_GLOBALS[(module, name)]
        found = _torch_name(name) if module == "torch" else None
        if found is None:
            raise UnsafeCheckpointError(f"global '{module}.{name}' is not allowed")
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)):
            raise CheckpointCorruptError(f"unknown persistent id {str(pid)[:80]}")
        _, kind, key, _location, numel = pid
        if key not in self._storages:
            numel = _count(numel, "a storage size")
            record = f"{self._archive.prefix}/data/{key}"
            size = self._archive.size(record)
            if size is None:
                raise CheckpointCorruptError(f"storage record {key!r} is missing")
            itemsize = torch.empty(0, dtype=kind.dtype).element_size()
            if size != numel * itemsize:
                raise CheckpointCorruptError(
                    f"storage record {key!r} holds {size} bytes, its tensor declares {numel * itemsize}"
                )
            data = self._archive.record(record)
            raw = torch.frombuffer(data, dtype=torch.uint8) if numel else torch.empty(0, dtype=torch.uint8)
            self._storages[key] = _Stored(raw.untyped_storage(), kind.dtype, numel)
        return self._storages[key]


def load_stored(data: bytes | bytearray, where: str) -> Any:
    """Unpickle one value DCP stored (a tensor or any non-tensor value), admitting only
    tensors and plain data: nothing named in it is imported or called beyond that, and
    nothing larger than the stored bytes is allocated. Tensors share ``data``'s memory."""
    try:
        archive = _Archive(data if isinstance(data, bytearray) else bytearray(data))
        return _StoredValueUnpickler(archive).load()
    except UnsafeCheckpointError as exc:
        raise UnsafeCheckpointError(f"refused to load {where}: it is not plain data ({exc})") from None
    except CheckpointCorruptError as exc:
        raise CheckpointCorruptError(f"{where} is damaged: {exc}") from None
    except Exception as exc:
        raise CheckpointCorruptError(
            f"{where} is damaged: not a stored torch value ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor values are loaded by :func:`load_stored`."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self._where = where

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        obj = load_stored(value.getvalue(), f"stored value '{fqn}' of {self._where}")
        if self.flatten_state_dict:
            set_path(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj
