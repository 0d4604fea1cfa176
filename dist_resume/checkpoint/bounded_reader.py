"""DCP's storage reader for a checked step: each item is read as its exact byte range and
unpickled as plain data only (G8)."""

from __future__ import annotations

import io
import os
import posixpath
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    Metadata,
    StorageMeta,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from dist_resume.checkpoint.bounded_files import read_range
from dist_resume.checkpoint.stored_values import load_stored
from dist_resume.errors import CheckpointCorruptError
from dist_resume.storage import Location


_PROBED_ABOVE = 2**20  # bytes of a stored value whose ends are checked before it is read whole
_ZIP_START, _ZIP_END, _END_RECORD = b"PK\x03\x04", b"PK\x05\x06", 22  # torch.save's archive: a zip


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

    def _probe(self, path: str, offset: int, length: int, fqn: str) -> None:
        """Refuse a large stored value whose first and last bytes are not an archive's,
        before its claimed length is allocated (a sparse shard's zeros, say)."""
        first = read_range(self._loc, path, offset, len(_ZIP_START), self._where)
        last = read_range(self._loc, path, offset + length - _END_RECORD, _END_RECORD, self._where)
        if bytes(first) != _ZIP_START or bytes(last[:4]) != _ZIP_END:
            raise CheckpointCorruptError(f"'{fqn}' of {self._where} is damaged: its {length} bytes are not a stored "
                                         "torch value")

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for item in plan.items:
            info = self._metadata.storage_data[item.storage_index]
            path = posixpath.join(self._directory, info.relative_path)
            if info.length > _PROBED_ABOVE:
                self._probe(path, info.offset, info.length, item.storage_index.fqn)
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
