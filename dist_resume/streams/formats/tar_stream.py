"""A shard's tar stream: its bytes as stored, or as they decompress (gzip, bzip2, xz, as
tarfile's ``r|*`` reads them), told apart by the shard's first block."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
from collections.abc import Callable
from typing import Any, BinaryIO

from dist_resume.streams.formats.tar_headers import BLOCK, ZERO_BLOCK, MalformedHeader, check_sum
from dist_resume.streams.formats.tar_members import TarBytes

DECOMPRESSORS: dict[str, Callable[[BinaryIO], BinaryIO]] = {
    "gzip": lambda file: gzip.GzipFile(fileobj=file, mode="rb"),
    "bzip2": lambda file: bz2.BZ2File(file),
    "xz": lambda file: lzma.LZMAFile(file),
}
MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"), (b"\x5d\x00\x00\x80", "xz"),
         (b"\x28\xb5\x2f\xfd", "zstd"), (b"\x1f\x9d", "compress (.Z)"))


def compression(head: bytes) -> str | None:
    """The compression whose magic number starts `head`, a shard's first block (None: a tar
    header, or none known; a tar's first header wins over a name that looks like a magic)."""
    if len(head) == BLOCK:
        if head == ZERO_BLOCK:
            return None
        try:
            check_sum(head)
            return None
        except MalformedHeader:
            pass
    return next((kind for magic, kind in MAGIC if head.startswith(magic)), None)


def tar_stream(file: BinaryIO, where: str, read_bytes: int) -> TarBytes:
    """The tar stream of the shard `file` (named `where`), decompressed if it is compressed;
    a compression that is not read is a `ValueError` naming it."""
    head = file.read(BLOCK)
    while len(head) < BLOCK and (more := file.read(BLOCK - len(head))):  # a pipe may hand out less
        head += more
    kind = compression(head)
    if kind is None:
        return TarBytes(file, read_bytes, head)
    if kind not in DECOMPRESSORS:
        raise ValueError(f"{where}: the shard is compressed with {kind}, which this reader does not read (it reads "
                         f"{', '.join(DECOMPRESSORS)} and plain tar)")
    return TarBytes(Decompressed(head, file, kind, where), read_bytes)


class Decompressed:
    """What a compressed shard decompresses to, read in bounded steps; a damaged compressed
    stream is a `ValueError` naming the shard (a failure of the shard's file stays what it
    is: a storage error)."""

    def __init__(self, head: bytes, file: BinaryIO, kind: str, where: str) -> None:
        self.source = Rejoined(head, file)
        self.file = DECOMPRESSORS[kind](self.source)
        self.kind, self.where = kind, where

    def seekable(self) -> bool:
        return False  # skipped data is decompressed and dropped

    def read(self, size: int) -> bytes:
        try:
            return self.file.read(size)
        except Exception as error:
            if error is self.source.failure:
                raise
            raise ValueError(f"{self.where}: the shard's {self.kind} stream is damaged ({type(error).__name__}: "
                             f"{error})") from None


class Rejoined(io.RawIOBase):
    """A file's bytes from its start, its first block `head` already read from it; what the
    file raises is kept as `failure`."""

    def __init__(self, head: bytes, file: BinaryIO) -> None:
        self.head, self.file = head, file
        self.failure: BaseException | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.head:
            count = min(len(buffer), len(self.head))
            buffer[:count], self.head = self.head[:count], self.head[count:]
            return count
        try:
            data = self.file.read(len(buffer))
        except BaseException as error:
            self.failure = error
            raise
        buffer[:len(data)] = data
        return len(data)
