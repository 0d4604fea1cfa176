"""A checkpoint's files, read with bounded resources (G8): a file is read only if it is a
regular file inside the checkpoint location (a FIFO, a device or a symlink leading elsewhere
is refused before it is opened for reading), and never past a limit. A size that storage
reports (``stat``, an object's header) or that a file declares is a claim: it is checked
against the limit of what is read before anything is allocated from it, and a pickled file
is read front to back in chunks (`BoundedStream`), so that a file of zeros, sparse or not,
is refused at its first byte, whatever size it claims.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import stat

from dist_resume.errors import CheckpointCorruptError, UnsafeCheckpointError
from dist_resume.storage import Location, retry

CHUNK = 4 * 2**20  # the first read of a stream; later reads double, up to MAX_CHUNK
MAX_CHUNK = 64 * 2**20
LARGEST_READ = 64 * 2**20  # one object of a pickled metadata file (DCP's are names and tuples)


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
    """The size the checkpoint file ``path`` claims, refused unless it is a regular file inside ``loc``."""
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


def _read_at(loc: Location, path: str, fd: int | None, offset: int, length: int) -> bytes:
    """Up to ``length`` bytes of ``path`` from ``offset`` (fewer at its end)."""
    if fd is not None:
        return os.pread(fd, length, offset)
    try:
        return retry(loc.fs.cat_file, path, start=offset, end=offset + length)
    except Exception as exc:
        raise loc.error("read", path, exc) from None


def read_range(loc: Location, path: str, offset: int, length: int, where: str) -> bytearray:
    """``length`` bytes of the checkpoint file ``path`` from ``offset``; all of them or an
    error. ``length`` is allocated: the caller bounds it first."""
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
        data = bytearray(_read_at(loc, path, None, offset, length))
        done = len(data)
    else:
        data, done = bytearray(), 0
    if done != length:
        raise CheckpointCorruptError(
            f"{where} is damaged: {posixpath.basename(path)} ends before byte {offset + length}"
        )
    return data


def _too_large(where: str, path: str, limit: int, size: int | None = None) -> CheckpointCorruptError:
    held = f"has {size} bytes, more than {limit}" if size is not None else f"holds more than {limit} bytes"
    return CheckpointCorruptError(f"{where} is damaged: {posixpath.basename(path)} {held}")


def read_whole(loc: Location, path: str, where: str, limit: int) -> bytes:
    """The checkpoint file ``path``, refused if it holds more than ``limit`` bytes (read in
    chunks to its end, whatever size it claims)."""
    with BoundedStream(loc, path, where, limit) as stream:
        data = stream.read_to_end()
    return data


class BoundedStream:
    """The checkpoint file ``path`` read front to back, for an unpickler (``read``,
    ``readline``, ``peek``): from storage in chunks as it is consumed, never more than
    ``limit`` bytes in all nor more than ``LARGEST_READ`` in one request of the reader, and
    what was consumed is hashed (`digest`)."""

    def __init__(self, loc: Location, path: str, where: str, limit: int) -> None:
        self._loc, self._path, self._where, self._limit = loc, path, where, limit
        self._fd = _open_local(loc, path, where) if loc.is_local else None
        try:
            self._size = os.fstat(self._fd).st_size if self._fd is not None else file_size(loc, path, where)
            if self._size > limit:  # a claim, but one that the reads would confirm or the file be damaged
                raise _too_large(where, path, limit, self._size)
        except BaseException:
            self.close()
            raise
        self._buffer = bytearray()
        self._start = 0  # consumed bytes at the front of the buffer
        self._offset = 0  # the file's bytes fetched so far
        self._chunk = CHUNK
        self._ended = False
        self._hash = hashlib.sha256()
        self.consumed = 0

    def __enter__(self) -> BoundedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def digest(self) -> str:
        """The SHA-256 of the bytes consumed so far, in hex."""
        return self._hash.hexdigest()

    def _fill(self, wanted: int) -> None:
        """Fetch until ``wanted`` bytes are buffered beyond the consumed ones, or the file ends."""
        while len(self._buffer) - self._start < wanted:
            if self._ended or self._fd is None and self._offset >= self._size:
                return
            ask = min(max(self._chunk, wanted), self._limit + 1 - self._offset)
            if ask <= 0:
                raise _too_large(self._where, self._path, self._limit)
            if self._fd is None:
                ask = min(ask, self._size - self._offset)
            piece = _read_at(self._loc, self._path, self._fd, self._offset, ask)
            if len(piece) < ask:  # a regular file's end (an object's claimed end: a shorter one is cut short)
                self._size = self._offset + len(piece)
                self._ended = True
            if self._start > len(self._buffer) // 2:
                del self._buffer[:self._start]
                self._start = 0
            self._buffer += piece
            self._offset += len(piece)
            self._chunk = min(2 * self._chunk, MAX_CHUNK)

    def _take(self, count: int) -> bytes:
        with memoryview(self._buffer) as view:
            data = bytes(view[self._start:self._start + count])
        self._start += len(data)
        self.consumed += len(data)
        self._hash.update(data)
        return data

    def require_end(self) -> None:
        """Refuse a file that holds more than was consumed (its claimed size says so: unread)."""
        beyond = max(self._size, self._offset) - self.consumed
        if beyond:
            raise CheckpointCorruptError(f"{self._where} is damaged: {posixpath.basename(self._path)} holds "
                                         f"{beyond} bytes after its end")

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self.read_to_end()
        if size > LARGEST_READ:
            raise CheckpointCorruptError(f"{self._where} is damaged: {posixpath.basename(self._path)} declares an "
                                         f"object of {size} bytes, more than {LARGEST_READ}")
        self._fill(size)
        return self._take(size)

    def readline(self, size: int = -1) -> bytes:
        while True:
            end = self._buffer.find(b"\n", self._start)
            if end >= 0:
                return self._take(end + 1 - self._start)
            buffered = len(self._buffer) - self._start
            if buffered > LARGEST_READ:
                return self.read(LARGEST_READ + 1)  # refused
            self._fill(buffered + 1)
            if len(self._buffer) - self._start == buffered:  # the file ended
                return self._take(buffered)

    def peek(self, size: int = 0) -> bytes:
        size = min(max(size, 1), LARGEST_READ)
        self._fill(size)
        with memoryview(self._buffer) as view:
            return bytes(view[self._start:self._start + size])

    def read_to_end(self) -> bytes:
        """The rest of the file, refused past ``limit``."""
        while True:
            buffered = len(self._buffer) - self._start
            self._fill(buffered + 1)
            if len(self._buffer) - self._start == buffered:
                return self._take(buffered)
