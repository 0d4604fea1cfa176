"""Loading a DCP checkpoint without running code from it (G8).

DCP unpickles ``.metadata`` with plain ``pickle`` and non-tensor values with
``torch.load(weights_only=False)``; both would execute whatever a crafted file asks for.
Here ``.metadata`` goes through an unpickler that admits only DCP's metadata types and
plain data, and stored values through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import ReadItem

from dist_resume.errors import UnsafeCheckpointError
from dist_resume.nested import set_path

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
        # dtypes pickle as torch.<name>; torch is imported already, so looking the name
        # up runs nothing (an unknown module is never imported).
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(f"global '{module}.{name}' is not allowed")


def unpickle_metadata(data: bytes, where: str) -> Metadata:
    """Unpickle DCP ``.metadata`` bytes, admitting only DCP's metadata types and plain data."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpointError as exc:
        raise UnsafeCheckpointError(
            f"refused to load {where}: {exc}; only DCP metadata types and plain data are"
        ) from None
    except Exception as exc:
        raise UnsafeCheckpointError(
            f"refused to load {where}: not a DCP metadata file ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(
            f"refused to load {where}: holds a {type(metadata).__name__}, not DCP Metadata"
        )
    return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor values are loaded with ``weights_only=True``."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self._where = where

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            lines = [line for line in str(exc).splitlines() if "GLOBAL" in line]
            detail = lines[0].strip() if lines else str(exc).strip().splitlines()[0]
            raise UnsafeCheckpointError(
                f"refused to load stored value '{fqn}' of {self._where}: "
                f"it is not plain data ({detail})"
            ) from None
        if self.flatten_state_dict:
            set_path(self.original_state_dict, self.mappings[fqn], obj)
        else:
            self.state_dict[fqn] = obj
