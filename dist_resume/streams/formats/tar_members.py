"""The members of an uncompressed tar stream, parsed from their header blocks and read in
large blocks; what the stream does not hold as a tar writer writes it is one `ValueError`
naming the shard and the member (or the byte where the damage is), never a wrong member."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, BinaryIO

from dist_resume.streams.formats.tar_headers import (
    BLOCK, DATALESS, EXTENSIONS, LONG_LINK, LONG_NAME, PAX_GLOBAL, PAX_LOCAL, REGULAR, SPARSE, ZERO_BLOCK, MalformedHeader,
    pax_records, pax_size, parse_header, text)

READ_BYTES = 1 << 18  # what reading samples asks the file for at once: many small members a call
COUNT_BYTES = 1 << 13  # what counting asks for: a header's block, and the data of small members with it
PIECE_BYTES = 1 << 23  # the most a large member's data is read in at once
EXTENSION_LIMIT = 1 << 20  # the longest pax header or GNU long name read (libarchive's limit for pax, too)
SEEN_LIMIT = 64  # extended header blocks whose parse a reading remembers
EXTENSION_CODES = frozenset(kind[0] for kind in EXTENSIONS)
GLOBAL_REFUSED = (b"path", b"size", b"linkpath")  # a global pax header setting these would rename or resize every member


class TarBytes:
    """The bytes of a tar stream from `file`, asked for `read_bytes` at a time (more only
    to hold one member's data, in pieces of PIECE_BYTES: never what a header claims before
    the file has it). Data to skip is seeked over when the file can seek."""

    def __init__(self, file: BinaryIO, read_bytes: int, first: bytes = b"") -> None:
        self.file = file
        self.read_bytes = read_bytes
        self.buffer = first
        self.position = 0  # in `buffer`; past its end when data or padding is to be skipped
        self.start = 0  # the stream offset of buffer[0]
        self.seekable = bool(getattr(file, "seekable", lambda: False)())
        self.end: int | None = None  # the stream's length, once its end was met

    def take(self, size: int) -> bytes:
        """The next `size` bytes (fewer: the stream ended), then on past their padding to a
        whole block."""
        position = self.position
        stop = position + size
        if stop <= len(self.buffer):
            self.position = stop + (-size % BLOCK)
            return self.buffer[position:stop]
        return self._take_read(size)

    def skip(self, size: int) -> None:
        """On past `size` bytes and their padding, read or seeked over when next asked for."""
        self.position += size + (-size % BLOCK)

    def length(self) -> int:
        """The stream's length (known once its end was met; else the file's, by seeking)."""
        if self.end is None:
            self.end = self.file.seek(0, io.SEEK_END)
        return self.end

    def _take_read(self, size: int) -> bytes:
        self._drop_consumed()
        pieces, have = [self.buffer], len(self.buffer)
        while have < size and self.end is None:
            want = size - have
            piece = self.file.read(self.read_bytes if want <= self.read_bytes else min(want, PIECE_BYTES))
            if piece:
                pieces.append(piece)
                have += len(piece)
            else:
                self.end = self.file.seek(0, io.SEEK_END) if self.seekable else self.start + have
        self.buffer = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if have < size:
            self.position = have
            return self.buffer
        self.position = size + (-size % BLOCK)
        return self.buffer if have == size else self.buffer[:size]

    def _drop_consumed(self) -> None:
        """The buffer then holds only bytes from `start` on: the consumed ones are dropped,
        and those to skip beyond them seeked over (or read past)."""
        excess = self.position - len(self.buffer)
        self.start += self.position
        self.buffer = self.buffer[self.position:] if excess < 0 else b""
        self.position = 0
        if excess > 0 and self.end is None:
            if self.seekable:
                self.file.seek(excess, io.SEEK_CUR)
                return
            while excess:
                piece = self.file.read(min(excess, PIECE_BYTES))
                if not piece:
                    self.end = self.start - excess
                    return
                excess -= len(piece)


def tar_members(stream: TarBytes, where: str, data: bool) -> Iterator[tuple[str, bytes | None]]:
    """(name, data) of each regular file of the tar `stream`, in the archive's order (data
    None when `data` is false: skipped, seeked over where the file can seek). Directories,
    links, devices and FIFOs hold no data and are passed over. A damaged header, a member
    this reader does not read (GNU sparse files, volume labels, unknown types), a claimed
    size the shard does not hold, or a shard that ends without tar's end-of-archive block is
    a `ValueError` naming ``where`` and the member or byte."""
    last: tuple[str, int, int] | None = None  # name, data offset and size of the last member
    take = stream.take
    seen: dict[bytes, tuple[bytes, str, int]] = {}
    while True:
        offset = stream.start + stream.position
        header = take(BLOCK)
        if header == ZERO_BLOCK:
            return
        if len(header) < BLOCK:
            raise ValueError(f"{where}: {ending(stream, last)}")
        if header[156] in EXTENSION_CODES:
            kind, name, size = extended(stream, where, header, offset, last, seen)
        else:
            try:
                kind, name, size = parse_header(header)
            except MalformedHeader as problem:
                raise ValueError(f"{where}: {damaged(offset, last, problem)}") from None
        if kind in REGULAR:
            last = (name, stream.start + stream.position, size)
            if data:
                payload = take(size)
                if len(payload) < size:
                    raise ValueError(f"{where}: {truncated(name, size, len(payload))}")
                yield name, payload
            else:
                stream.skip(size)
                yield name, None
        elif kind in DATALESS and not size:
            last = (name, stream.start + stream.position, 0)
        else:
            raise ValueError(f"{where}: tar member {name!r} (at byte {offset}) {unread(kind, size)}")


def extended(stream: TarBytes, where: str, header: bytes, offset: int, last: tuple[str, int, int] | None,
             seen: dict[bytes, tuple[bytes, str, int]]) -> tuple[bytes, str, int]:
    """(type flag, name, size) of the member whose first header, at `offset`, is `header`, an
    extended header (pax, GNU long name or link): the extended headers read up to the
    member's own, and applied as tarfile applies them (of two that set a name or a size,
    the first). `seen`: the parses of extended header blocks met before (writers repeat
    them byte for byte: WebDataset's, a pax header before every file)."""
    take = stream.take
    payloads = []  # (type, payload) of the extended headers that may set what a sample needs
    parsed = seen.get(header)
    while True:
        if parsed is None:
            try:
                parsed = parse_header(header)
            except MalformedHeader as problem:
                raise ValueError(f"{where}: {damaged(stream.start + stream.position - BLOCK, last, problem)}") from None
            if parsed[0] in EXTENSIONS and len(seen) < SEEN_LIMIT:
                seen[header] = parsed
        kind, name, size = parsed
        if kind not in EXTENSIONS:
            return applied(payloads, kind, name, size, where, offset) if payloads else parsed
        if size > EXTENSION_LIMIT:
            raise ValueError(f"{where}: the extended header at byte {stream.start + stream.position - BLOCK} declares "
                             f"{size:,} bytes, more than the {EXTENSION_LIMIT:,} this reader reads")
        payload = take(size)
        header = take(BLOCK)
        if len(payload) != size or len(header) != BLOCK or header == ZERO_BLOCK:
            raise ValueError(f"{where}: the shard ends inside the extended header at byte {offset}, before its "
                             "member's header: it is truncated")
        # A local pax header of no name, size or sparse map (WebDataset's: a time) sets nothing a sample needs.
        if kind != PAX_LOCAL or b"path=" in payload or b"size=" in payload or b"GNU.sparse." in payload:
            payloads.append((kind, payload))
        parsed = seen.get(header) if header[156] in EXTENSION_CODES else None


def applied(payloads: list[tuple[bytes, bytes]], kind: bytes, name: str, size: int, where: str,
            offset: int) -> tuple[bytes, str, int]:
    """(type flag, name, size) of the member at `offset` whose own header reads `kind`,
    `name` and `size`, once its extended headers' `payloads` are applied."""
    long_name = path = new_size = None
    for extension, payload in payloads:
        if extension == LONG_NAME:
            if long_name is None and path is None:
                long_name = text(payload)
        elif extension != LONG_LINK:
            try:
                records = pax_records(payload)
                new_size = pax_size(records) if new_size is None else new_size
            except MalformedHeader as problem:
                raise ValueError(f"{where}: tar member {name!r} (at byte {offset}): {problem}") from None
            if any(key.startswith(b"GNU.sparse.") for key in records):
                kind = SPARSE
            if extension == PAX_GLOBAL:
                refused = [key.decode() for key in GLOBAL_REFUSED if key in records]
                if refused:
                    raise ValueError(f"{where}: the global pax header before tar member {name!r} (at byte {offset}) "
                                     f"sets {', '.join(refused)} for every member after it, which this reader refuses")
            elif path is None and long_name is None and (b"path" in records or b"GNU.sparse.name" in records):
                path = records.get(b"GNU.sparse.name", records.get(b"path")).decode("utf-8", "surrogateescape").rstrip("/")
    name = path if path is not None else long_name if long_name is not None else name
    return kind, name, size if new_size is None else new_size


def damaged(offset: int, last: tuple[str, int, int] | None, problem: MalformedHeader) -> str:
    after = f" (after tar member {last[0]!r})" if last else ""
    return f"tar header at byte {offset}{after} is damaged: {problem}"


def unread(kind: bytes, size: int) -> str:
    """Why this reader refuses a member of type flag `kind` and `size` bytes of data."""
    if kind == SPARSE:
        return "is a GNU sparse file, which this reader does not read (its holes would have to be made up)"
    if kind in DATALESS:
        return f"is a {DATALESS[kind]} that declares {size:,} bytes of data; tar writers write none"
    return f"has type {kind!r}, which this reader does not read"


def truncated(name: str, size: int, stored: int) -> str:
    return f"tar member {name!r} declares {size:,} bytes, but the shard ends after {stored:,} of them: it is truncated"


def ending(stream: TarBytes, last: tuple[str, int, int] | None) -> str:
    """What the end of the stream, met where a header should be, means."""
    end = stream.length()
    if last is not None and end < last[1] + last[2]:
        return truncated(last[0], last[2], max(end - last[1], 0))
    if end == 0:
        return "the shard is empty, not a tar archive"
    after = f" after tar member {last[0]!r}" if last else ""
    return f"the shard ends at byte {end:,}{after} without tar's end-of-archive block: it is truncated"
