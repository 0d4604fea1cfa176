"""Shard files of each format, built in memory and written to any fsspec URL, for the
format readers' tests and benchmark B7."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Sequence
from typing import Any

import fsspec


class CountingFile(io.BytesIO):
    """An in-memory shard that counts the bytes read from it and has a name."""

    name = "mem://shard"

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer) -> int:
        count = super().readinto(buffer)
        self.bytes_read += count
        return count


def jsonl_bytes(items: Sequence[Any]) -> bytes:
    return b"".join(json.dumps(item).encode() + b"\n" for item in items)


def parquet_bytes(rows: Sequence[dict[str, Any]], row_group_size: int, schema: Any = None) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(list(rows), schema=schema)
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue()


def tar_bytes(members: Sequence[tuple[str, bytes]], mode: str = "w", directories: Sequence[str] = ()) -> bytes:
    """A tar of `members` (name, data) in that order, after `directories` entries."""
    sink = io.BytesIO()
    with tarfile.open(fileobj=sink, mode=mode) as tar:
        for name in directories:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return sink.getvalue()


def write(url: str, data: bytes, storage_options: dict[str, Any] | None = None) -> str:
    with fsspec.open(url, "wb", **(storage_options or {})) as file:
        file.write(data)
    return url
