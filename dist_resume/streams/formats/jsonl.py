"""JSON Lines shards: one JSON value per line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from dist_resume.streams.formats.digest import ConfiguredDigest
from dist_resume.streams.formats.naming import file_name

CHUNK_BYTES = 1 << 20


def numbered_lines(file: BinaryIO, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """(line number from 1, line) of every line of ``file`` that holds more than whitespace,
    read in chunks (never the whole file at once)."""
    number, rest = 0, b""
    while True:
        chunk = file.read(chunk_bytes)
        if not chunk:
            break
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            number += 1
            if line.strip():
                yield number, line
    if rest.strip():
        yield number + 1, rest


@dataclass(frozen=True)
class JsonlReader(ConfiguredDigest):
    """Reads a JSON Lines shard: each line one JSON value, yielded parsed, in file order.
    Lines of only whitespace (a trailing newline, a blank line) hold no item. A line that is
    not valid JSON in `encoding` is a `ValueError` naming the file and the line number."""

    draws_randomness = False  # ShardedStream reads it without seeding the global generators

    encoding: str = "utf-8"

    def __call__(self, file: BinaryIO) -> Iterator[Any]:
        for number, line in numbered_lines(file):
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
        return sum(1 for _ in numbered_lines(file))
