"""DCP's ``.metadata`` unpickled without running code from it (G8).

DCP unpickles ``.metadata`` with plain ``pickle``; here it goes through an unpickler that
admits only DCP's metadata types and plain data. A refused name is never imported.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING, Metadata

from dist_resume.checkpoint.collector import collector_paused
from dist_resume.checkpoint.torch_names import dtype_named
from dist_resume.errors import CheckpointError, UnsafeCheckpointError

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_DCP_METADATA, "Metadata"),
    (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "BytesStorageMetadata"),
    (_DCP_METADATA, "ChunkStorageMetadata"),
    (_DCP_METADATA, "TensorProperties"),
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    (_DCP_METADATA, "StorageMeta"),
    (_DCP_METADATA, "MetadataIndex"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # maps a layout's name to torch's layout object
    # plain DCP saves of a local path store the checkpoint id as a Path
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        # Some Pythons (Debian's 3.11.2, CPython 3.12+) pickle an enum member as
        # getattr(its class, its name): admit exactly that, for DCP's own enum.
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        # dtypes pickle as torch.<name> (an unknown module is never imported)
        dtype = dtype_named(name) if module == "torch" else None
        if dtype is not None:
            return dtype
        raise UnsafeCheckpointError(f"global '{module}.{name}' is not allowed")


def _enum_member(cls: Any, name: str) -> Any:
    if cls is not _MEM_FORMAT_ENCODING or not isinstance(name, str) or name not in _MEM_FORMAT_ENCODING.__members__:
        raise UnsafeCheckpointError(f"getattr({cls!r}, {name!r}) is not allowed")
    return _MEM_FORMAT_ENCODING[name]


def unpickle_metadata(source: bytes | Any, where: str) -> Metadata:
    """Unpickle DCP ``.metadata`` (its bytes, or a file such as a `BoundedStream`),
    admitting only DCP's metadata types and plain data."""
    try:
        with collector_paused():
            metadata = _MetadataUnpickler(io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source).load()
    except UnsafeCheckpointError as exc:
        raise UnsafeCheckpointError(
            f"refused to load {where}: {exc}; only DCP metadata types and plain data are"
        ) from None
    except CheckpointError:  # the file's own reads: damage, storage
        raise
    except MemoryError:
        raise UnsafeCheckpointError(f"refused to load {where}: it declares an object larger than memory "
                                    "(damaged or crafted)") from None
    except Exception as exc:
        raise UnsafeCheckpointError(
            f"refused to load {where}: not a DCP metadata file ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(
            f"refused to load {where}: holds a {type(metadata).__name__}, not DCP Metadata"
        )
    return metadata
