"""JSON Lines shards: one JSON value per line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from dist_resume.streams.formats.digest import ConfiguredDigest
from dist_resume.streams.formats.naming import file_name

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 28  # 256 MiB: JsonlReader's default limit on one line


def line_runs(file: BinaryIO, chunk_bytes: int = CHUNK_BYTES,
              max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, list[bytes]]]:
    """The lines of ``file`` (split at ``\n``, which they lose), as (number of the first,
    from 1; the lines) per chunk read, never the whole file at once: each byte is copied a
    bounded number of times, however long its line. A line longer than ``max_line_bytes``
    is a ValueError naming the file and the line, raised once that many bytes of it are
    read (never more held)."""
    number = 1
    pending: list[bytes] = []  # the start of a line that no chunk read so far has ended
    held = 0  # its bytes
    while True:
        chunk = file.read(chunk_bytes)
        if not chunk:
            break
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if lines:
            if pending:
                held += len(lines[0])
                _check_length(held, file, number, max_line_bytes)
                lines[0] = b"".join([*pending, lines[0]])
                pending, held = [], 0
            if len(chunk) > max_line_bytes:  # then a line within the chunk may exceed the limit too
                for index, line in enumerate(lines):
                    _check_length(len(line), file, number + index, max_line_bytes)
            yield number, lines
            number += len(lines)
        if rest:
            held += len(rest)
            _check_length(held, file, number, max_line_bytes)
            pending.append(rest)
    if pending:
        yield number, [b"".join(pending)]


def _check_length(length: int, file: BinaryIO, number: int, limit: int) -> None:
    if length > limit:
        raise ValueError(f"{file_name(file)}: line {number} is longer than {limit} bytes, the JsonlReader's "
                         "max_line_bytes")


def numbered_lines(file: BinaryIO, chunk_bytes: int = CHUNK_BYTES,
                   max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line) of every line of ``file`` that holds more than whitespace,
    read as `line_runs` reads them."""
    for first, lines in line_runs(file, chunk_bytes, max_line_bytes):
        for number, line in enumerate(lines, first):
            if line.strip():
                yield number, line


@dataclass(frozen=True)
class JsonlReader(ConfiguredDigest):
    """Reads a JSON Lines shard: each line one JSON value, yielded parsed, in file order.
    Lines of only whitespace (a trailing newline, a blank line) hold no item. A line that is
    not valid JSON in `encoding`, or longer than `max_line_bytes` (default 256 MiB), is a
    `ValueError` naming the file and the line number; reading and memory are linear in a
    line's length up to that limit."""

    draws_randomness = False  # ShardedStream reads it without seeding the global generators

    encoding: str = "utf-8"
    # Not in the repr, hence not in the digest: a limit refuses lines, it never changes an item.
    max_line_bytes: int = field(default=MAX_LINE_BYTES, repr=False)

    def __post_init__(self) -> None:
        if type(self.max_line_bytes) is not int or self.max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be an int >= 1, got {self.max_line_bytes!r}")

    def __call__(self, file: BinaryIO) -> Iterator[Any]:
        for number, line in numbered_lines(file, max_line_bytes=self.max_line_bytes):
            try:
                yield json.loads(line.decode(self.encoding))
            except UnicodeDecodeError as exc:
                raise ValueError(f"{file_name(file)}: line {number} is not valid {self.encoding} "
                                 f"(byte {exc.start + 1}: {exc.reason})") from None
            except json.JSONDecodeError as exc:
                raise ValueError(f"{file_name(file)}: line {number} is not valid JSON "
                                 f"({exc.msg} at column {exc.colno})") from None

    def count(self, file: BinaryIO) -> int:
        """The number of items the shard holds: its lines with more than whitespace (not parsed)."""
        return sum(sum(map(bool, map(bytes.strip, lines)))
                   for _, lines in line_runs(file, max_line_bytes=self.max_line_bytes))
