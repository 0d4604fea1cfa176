"""Hostile shards (issue 33): a shard that is not a regular file is refused, naming it, before
anything opens it (a FIFO without a writer blocked the open, /dev/zero never ended); a JSONL
line is read in time and memory linear in its length (each 1 MiB chunk used to copy the
line's start again), up to a documented limit past which it is one error naming the shard
and the line. The hanging cases run in a fenced process (tests/hostile_files.py): one still
running after HANG_LIMIT seconds fails its test instead of hanging the suite."""

from __future__ import annotations

import io
import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import ResumableDataLoader
from dist_resume.errors import StorageError
from dist_resume.streams import ShardedStream
from dist_resume.streams.formats import JsonlReader, ParquetReader, WebDatasetReader
from dist_resume.streams.formats.jsonl import numbered_lines

from .format_files import jsonl_bytes, write
from .hostile_files import outcome
from .s3_server import s3_bucket, s3_endpoint  # noqa: F401

NOT_A_FILE = ("StorageError: cannot read shard {url}: it is {kind}, not a regular file; a shard must be a regular "
              "file or an object in an object store")


@pytest.fixture
def fifo(tmp_path) -> str:
    path = str(tmp_path / "shard-0.jsonl")
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("counts_cache", [True, None], ids=["counts kept", "counts not kept"])
def test_a_fifo_without_a_writer_is_refused_before_it_is_counted(fifo, counts_cache):
    code = f"ShardedStream([{fifo!r}], JsonlReader(), counts_cache={counts_cache}).lengths()"
    assert outcome(code) == NOT_A_FIFO.format(url=fifo)


def test_a_fifo_is_refused_before_it_is_read(fifo):
    code = f"list(ResumableDataLoader(ShardedStream([{fifo!r}], JsonlReader(), lengths=[1]), batch_size=1))"
    assert outcome(code) == NOT_A_FIFO.format(url=fifo)


NOT_A_FIFO = NOT_A_FILE.replace("{kind}", "a FIFO")


@pytest.mark.parametrize("reader", ["JsonlReader()", "ParquetReader()", "WebDatasetReader()"])
def test_dev_zero_is_refused_as_a_shard(reader):
    code = f"ShardedStream(['/dev/zero'], {reader}).lengths()"
    assert outcome(code) == NOT_A_FILE.format(url="/dev/zero", kind="a character device")


def test_a_directory_is_refused_as_a_shard(tmp_path):
    with pytest.raises(StorageError, match=re.escape(NOT_A_FILE.format(url=tmp_path, kind="a directory")[14:])):
        ShardedStream([str(tmp_path)], JsonlReader(), counts_cache=None).lengths()


def test_a_link_to_a_regular_file_is_a_shard(tmp_path):
    target = write(str(tmp_path / "data.jsonl"), jsonl_bytes([1, 2, 3]))
    os.symlink(target, tmp_path / "link.jsonl")
    stream = ShardedStream([str(tmp_path / "link.jsonl")], JsonlReader(), shuffle=False)
    assert stream.lengths() == [3]
    assert [batch.tolist() for batch in ResumableDataLoader(stream, batch_size=3)] == [[1, 2, 3]]


def test_an_s3_prefix_is_refused_as_a_shard(s3_bucket):  # noqa: F811
    write(f"{s3_bucket}/data/part-0.jsonl", jsonl_bytes([1]))
    with pytest.raises(StorageError, match=re.escape(
            f"cannot read shard {s3_bucket}/data: it is a 'directory' entry, not a regular file")):
        ShardedStream([f"{s3_bucket}/data"], JsonlReader()).lengths()


# JSON Lines: one long line

def test_a_line_of_8_mib_read_in_64_byte_chunks_is_read_in_linear_time():
    """The old splitter copied the line's start at every chunk: 131,072 copies of up to
    8 MiB (hours); linear, well under a second. Fenced: the old code fails by HANG_LIMIT."""
    code = ("import io; from dist_resume.streams.formats.jsonl import numbered_lines; "
            "lines = list(numbered_lines(io.BytesIO(b'\"' + b'x' * (8 << 20) + b'\"\\n1\\n'), chunk_bytes=64)); "
            "assert [(number, len(line)) for number, line in lines] == [(1, (8 << 20) + 2), (2, 1)], lines[1:]")
    assert outcome(code) == "ok"


def test_a_line_of_128_mib_is_one_item():
    line = b'"' + b"x" * (128 << 20) + b'"'
    assert list(JsonlReader()(io.BytesIO(line + b"\n[1]\n"))) == ["x" * (128 << 20), [1]]


class EndlessLine(io.RawIOBase):
    """A shard whose first line never ends (as /dev/zero's), counting the bytes read."""

    name = "mem://endless.jsonl"

    def __init__(self) -> None:
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        buffer[:] = b"x" * len(buffer)
        self.bytes_read += len(buffer)
        return len(buffer)


@pytest.mark.parametrize("use", ["read", "count"])
def test_a_line_past_the_limit_is_one_error_naming_the_shard_and_line_read_no_further(use):
    reader = JsonlReader(max_line_bytes=3 << 20)
    file = EndlessLine()
    with pytest.raises(ValueError, match=re.escape(
            "mem://endless.jsonl: line 1 is longer than 3145728 bytes, the JsonlReader's max_line_bytes")):
        list(reader(file)) if use == "read" else reader.count(file)
    assert file.bytes_read <= (3 << 20) + (1 << 20)  # up to the limit and the chunk that crossed it


def test_the_default_line_limit_bounds_an_endless_line():
    """Fenced: the old splitter held the whole line, to a MemoryError or the hang limit."""
    code = ("import io; from tests.test_hostile_shards import EndlessLine; "
            "JsonlReader().count(io.BufferedReader(EndlessLine()))")
    assert outcome(code) == ("ValueError: mem://endless.jsonl: line 1 is longer than 268435456 bytes, the "
                             "JsonlReader's max_line_bytes")


def test_the_line_limit_is_not_part_of_the_readers_digest():
    """A limit refuses lines, it never changes an item: states saved under one limit resume under another."""
    assert JsonlReader(max_line_bytes=10).digest == JsonlReader().digest
    with pytest.raises(ValueError, match=re.escape("max_line_bytes must be an int >= 1, got 0")):
        JsonlReader(max_line_bytes=0)


class ShortReads(io.RawIOBase):
    """`data`, each read returning the next of `sizes` bytes at most (then the rest)."""

    name = "mem://short.jsonl"

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self._data, self._sizes, self._at = data, list(sizes), 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        size = min(size, self._sizes.pop(0)) if self._sizes else size
        data = self._data[self._at:self._at + size]
        self._at += len(data)
        return data


@settings(max_examples=300)
@given(st.lists(st.sampled_from([b"", b" ", b"\t", b"\r", b"1", b"[2]", b"x" * 9, b"y" * 31]), max_size=12).map(
           b"\n".join) | st.binary(max_size=80),
       st.integers(1, 80), st.lists(st.integers(1, 40), max_size=20), st.integers(1, 40))
def test_the_line_splitter_is_bytes_split_over_any_chunking_and_short_reads(data, chunk, sizes, limit):
    """Whatever the chunk size, short reads and limit: the lines of `data.split(b"\\n")` with
    more than whitespace, numbered from 1, up to the first line longer than the limit, which
    is the one error (the lines read with it in its chunk may not have been handed out)."""
    lines = data.split(b"\n")
    expected = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    too_long = next((number for number, line in enumerate(lines, 1) if len(line) > limit), None)
    found: list[tuple[int, bytes]] = []
    try:
        for pair in numbered_lines(ShortReads(data, sizes), chunk, limit):
            found.append(pair)
    except ValueError as exc:
        assert too_long is not None
        assert str(exc) == f"mem://short.jsonl: line {too_long} is longer than {limit} bytes, the JsonlReader's max_line_bytes"
        expected = [(number, line) for number, line in expected if number < too_long]
        assert found == expected[:len(found)]
    else:
        assert too_long is None
        assert found == expected
        reader = JsonlReader(max_line_bytes=limit)
        assert reader.count(ShortReads(data, sizes)) == len(expected)
