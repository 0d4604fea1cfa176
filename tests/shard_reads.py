"""Bytes read from each shard file, whatever reads it: local shards named `tally:///path`
are read through `TallyFileSystem`, a local file system that counts every byte it reads
from the operating system per path; shards on S3 through s3fs's two read calls, counted
per key (`s3_tally`). In this process only (readers at num_workers=0)."""

from __future__ import annotations

import collections
import io
from collections.abc import Iterator
from contextlib import contextmanager

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

TALLY = collections.Counter()  # path -> bytes read


class _CountedRaw(io.FileIO):
    def readinto(self, buffer) -> int | None:
        count = super().readinto(buffer)
        TALLY[self.name] += count or 0
        return count

    def readall(self) -> bytes:
        data = super().readall()
        TALLY[self.name] += len(data)
        return data


class TallyFileSystem(LocalFileSystem):
    """Local files, every byte read from them counted in `TALLY` under the file's path."""

    protocol = ("tally",)

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        if mode != "rb":
            return super()._open(path, mode, block_size, **kwargs)
        path = self._strip_protocol(path)
        file = io.BufferedReader(_CountedRaw(path, "r"))
        file.fs, file.path = self, path
        return file


fsspec.register_implementation("tally", TallyFileSystem, clobber=True)


def tallied(paths: list[str]) -> list[str]:
    """The URLs that read `paths` through `TallyFileSystem`."""
    return [f"tally://{path}" for path in paths]


@contextmanager
def bytes_read() -> Iterator[collections.Counter]:
    """The bytes read from each path while the context lasts (a fresh counter)."""
    TALLY.clear()
    yield TALLY


@pytest.fixture
def s3_tally(monkeypatch: pytest.MonkeyPatch) -> collections.Counter:
    """Bytes s3fs reads from each object ("bucket/key"): ranged reads of its files and
    `cat_file` (what opening ahead uses)."""
    import s3fs.core

    counter: collections.Counter = collections.Counter()
    fetch_range, cat_file = s3fs.core.S3File._fetch_range, s3fs.core.S3FileSystem._cat_file

    def counted_fetch(self, start, end):
        data = fetch_range(self, start, end)
        counter[self.path] += len(data)
        return data

    async def counted_cat(self, path, *args, **kwargs):
        data = await cat_file(self, path, *args, **kwargs)
        counter[self._strip_protocol(path)] += len(data)
        return data

    monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", counted_fetch)
    monkeypatch.setattr(s3fs.core.S3FileSystem, "_cat_file", counted_cat)
    return counter
