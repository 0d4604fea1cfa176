"""A checkpoint's files, read with bounded resources (G8): a file is read only if it is a
regular file inside the checkpoint location (a FIFO, a device or a symlink leading elsewhere
is refused before it is opened for reading), and never past the size asked for.
"""

from __future__ import annotations

import os
import posixpath
import stat

from dist_resume.errors import CheckpointCorruptError, UnsafeCheckpointError
from dist_resume.storage import Location, retry


class MissingFile(CheckpointCorruptError):
    """A checkpoint file that is not there (damage, unless its absence means something to
    the caller: a step without its commit marker is not committed)."""


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
        raise MissingFile(f"{where} is damaged: {name} is missing") from None
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
        raise MissingFile(f"{where} is damaged: {posixpath.basename(path)} is missing") from None
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
