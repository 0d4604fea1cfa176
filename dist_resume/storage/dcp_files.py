"""torch's fsspec adapter for DCP, with our retries, literal paths and no secrets in what it stores."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint._fsspec_filesystem import FileSystem, FsspecWriter
from torch.distributed.checkpoint.metadata import StorageMeta

from dist_resume.storage.location import Location
from dist_resume.storage.retries import retry

_SPOOL_BYTES = 64 * 2**20


class _KeepOpen:
    """DCP closes the stream it wrote to; the spool must stay open until it is uploaded."""

    def __init__(self, spool: Any) -> None:
        self._spool = spool

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spool, name)


class _WriteErrors:
    """A stream that remembers the OSError its ``write`` raised: torch's archive writer turns
    it into an "unexpected pos" enforce failure that no longer says what happened (ENOSPC)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._stream.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def _reporting_write_errors(stream: Any) -> Iterator[_WriteErrors]:
    """``stream`` for torch to write into; a failure after a write failed is that write's
    OSError (a full disk says ENOSPC), with what torch made of it as the cause."""
    watched = _WriteErrors(stream)
    try:
        yield watched
    except Exception as exc:
        if watched.error is None:
            raise
        raise watched.error from exc


class _RetryingFileSystem(FileSystem):
    """DCP's file operations with retries. Object-store writes are spooled locally and
    uploaded whole, so a transient failure retries the upload rather than failing DCP.
    Paths are names, never patterns: fsspec's ``mv`` and ``rm`` would glob a run called
    ``run*`` into its siblings, so renames copy and delete one file."""

    def __init__(self, loc: Location) -> None:
        super().__init__()
        self.fs = loc.fs
        self._local = loc.is_local

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        path = os.fspath(path)
        if "r" in mode:
            with retry(self.fs.open, path, mode) as stream:
                yield stream
        elif self._local:
            with super().create_stream(path, mode) as stream, _reporting_write_errors(stream) as watched:
                yield watched
        else:
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
                with _reporting_write_errors(_KeepOpen(spool)) as watched:
                    yield watched
                retry(self._upload, spool, path)

    def _upload(self, spool: Any, path: str) -> None:
        spool.seek(0)
        with self.fs.open(path, "wb") as remote:
            shutil.copyfileobj(spool, remote, 16 * 2**20)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        path, new_path = os.fspath(path), os.fspath(new_path)
        if self._local:
            os.replace(path, new_path)
            return
        retry(self.fs.cp_file, path, new_path)
        retry(self.fs.rm_file, path)

    def mkdir(self, path: str | os.PathLike) -> None:
        if self._local:
            os.makedirs(path, exist_ok=True)
        else:
            retry(self.fs.makedirs, os.fspath(path), exist_ok=True)

    def exists(self, path: str | os.PathLike) -> bool:
        return retry(self.fs.exists, os.fspath(path))

    def rm_file(self, path: str | os.PathLike) -> None:
        retry(self.fs.rm_file, os.fspath(path))

    def ls(self, path: str | os.PathLike) -> list[str]:
        return retry(self.fs.ls, os.fspath(path), detail=False)


class CheckpointWriter(FsspecWriter):
    """DCP storage writer for one save attempt's directory: retried I/O, no host-wide
    ``os.sync()`` on object stores (files are fsynced on local disks), never overwrites."""

    def __init__(self, loc: Location, path: str) -> None:
        super().__init__(path, sync_files=loc.is_local, overwrite=False)
        self.fs = _RetryingFileSystem(loc)
        self.path = path
        self._printable = loc.url_of(path)
        self.begun = threading.Event()  # set once DCP has begun the save (the first thing it asks for)

    def storage_meta(self) -> StorageMeta:
        self.begun.set()
        # DCP stores the checkpoint id in .metadata: keep credentials out of it.
        return StorageMeta(checkpoint_id=self._printable, save_id=self.save_id)
