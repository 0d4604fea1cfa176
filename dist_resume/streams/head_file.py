"""A shard file whose first bytes were fetched ahead in one request: reading takes them
from memory, and the rest, if any, from the shard's file when it gets there."""

from __future__ import annotations

import io
from typing import Any, BinaryIO

BUFFER_BYTES = 1 << 16  # a line-by-line reader refills from memory in steps this large


class _HeadThenRest(io.RawIOBase):
    """The bytes of `head` (a file's first bytes), then those of `rest` (the same file,
    open; None: `head` is all of it) from `len(head)` on."""

    def __init__(self, head: bytes, rest: BinaryIO | None) -> None:
        self._head = memoryview(head)
        self._rest = rest
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._rest is None or self._rest.seekable()

    def readinto(self, buffer: Any) -> int:
        if self._position < len(self._head):
            count = min(len(buffer), len(self._head) - self._position)
            buffer[:count] = self._head[self._position:self._position + count]
        elif self._rest is None:
            return 0
        else:
            if self._rest.tell() != self._position:
                self._rest.seek(self._position)
            data = self._rest.read(len(buffer))
            count = len(data)
            buffer[:count] = data
        self._position += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence == io.SEEK_END:
            offset += len(self._head) if self._rest is None else self._rest.seek(0, io.SEEK_END)
        elif whence != io.SEEK_SET:
            raise ValueError(f"invalid whence ({whence})")
        if offset < 0:
            raise ValueError(f"negative seek position {offset}")
        self._position = offset
        return offset

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        if self._rest is not None:
            self._rest.close()
        super().close()


class HeadFirstFile(io.BufferedReader):
    """A readable, seekable binary file of the shard at `path` of the fsspec file system
    `fs` (the attributes fsspec's own files have, which error messages name), made of
    `head`, the shard's first bytes, and `rest`, the shard's file open (None when `head`
    holds the whole shard: nothing else is ever opened). Closing it closes `rest`."""

    def __init__(self, head: bytes, rest: BinaryIO | None, fs: Any, path: str) -> None:
        super().__init__(_HeadThenRest(head, rest), BUFFER_BYTES)
        self.fs, self.path = fs, path
