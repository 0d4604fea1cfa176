"""A ShardedStream's item counts, learned once and kept (issue 35, point 1): a resume reads
no shard it does not train from, a second start over unchanged shards reads none to count
them, for every format, on local disk and on S3; a shard changed since (another size,
modification time or ETag) is counted again, and refused as before when its count
changed. Bytes are counted per shard file as the operating system or s3fs serves them
(tests/shard_reads.py)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from dist_resume import ResumableDataLoader, ResumeStateError
from dist_resume.streams import ShardedStream
from dist_resume.streams.formats import JsonlReader, ParquetReader, WebDatasetReader

from .format_files import jsonl_bytes, parquet_bytes, tar_bytes, write
from .s3_server import s3_bucket, s3_endpoint  # noqa: F401
from .shard_reads import bytes_read, s3_tally, tallied  # noqa: F401

SHARDS = 8
ITEMS = 24  # per shard
BATCH = 8


def _jsonl(shard: int, items: int) -> bytes:
    return jsonl_bytes([{"shard": shard, "item": item, "text": "x" * 40} for item in range(items)])


def _parquet(shard: int, items: int) -> bytes:
    return parquet_bytes([{"shard": shard, "item": item, "text": "x" * 40} for item in range(items)], row_group_size=8)


def _tar(shard: int, items: int) -> bytes:
    return tar_bytes([(f"s{shard}-{item:03}.{ext}", b"x" * 40) for item in range(items) for ext in ("txt", "cls")])


def _shard_of(item: Any) -> int:
    return int(item["__key__"][1:].split("-")[0]) if "__key__" in item else item["shard"]


FORMATS: dict[str, tuple[Callable[[int, int], bytes], Any, str]] = {
    "jsonl": (_jsonl, JsonlReader(), "jsonl"),
    "parquet": (_parquet, ParquetReader(), "parquet"),
    "tar": (_tar, WebDatasetReader(), "tar"),
}


@pytest.fixture(autouse=True)
def counts_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every stream of these tests keeps its counts in a fresh folder (the default place)."""
    folder = tmp_path / "counts-cache"
    monkeypatch.setenv("DIST_RESUME_COUNTS_CACHE", str(folder))
    return folder


def write_shards(root: str, fmt: str, options: dict[str, Any] | None = None, items: int = ITEMS) -> list[str]:
    make, _, extension = FORMATS[fmt]
    return [write(f"{root}/shard-{shard}.{extension}", make(shard, items), options) for shard in range(SHARDS)]


def collate(items: list[Any]) -> list[int]:
    return [_shard_of(item) for item in items]


def loader_of(urls: list[str], fmt: str, **options: Any) -> ResumableDataLoader:
    stream = ShardedStream(urls, FORMATS[fmt][1], window=4, seed=5, **options)
    return ResumableDataLoader(stream, batch_size=BATCH, collate_fn=collate)


def half_epoch_state(urls: list[str], fmt: str, **options: Any) -> tuple[dict[str, Any], list[list[int]]]:
    """The state after half of an epoch's batches, and the rest of the epoch's batches
    (each item as its shard), from an uninterrupted run of a first start."""
    batches = list(loader_of(urls, fmt, **options))
    loader = loader_of(urls, fmt, **options)
    iterator = iter(loader)
    for _ in range(len(batches) // 2):
        next(iterator)
    return loader.state_dict(), batches[len(batches) // 2:]


def read_paths(counter, urls: list[str]) -> set[int]:
    """The shards (by index) that any byte was read from."""
    paths = [fsspec.core.url_to_fs(url)[1] for url in urls]
    return {index for index, path in enumerate(paths) if counter[path]}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_resume_at_half_the_epoch_reads_only_the_shards_it_trains_from(tmp_path, fmt):
    urls = tallied(write_shards(str(tmp_path), fmt))
    state, rest = half_epoch_state(urls, fmt)
    with bytes_read() as counter:
        loader = loader_of(urls, fmt)
        loader.load_state_dict(state)
        resumed = list(loader)
    assert resumed == rest
    trained = {shard for batch in rest for shard in batch}
    assert len(trained) < SHARDS  # the first half of the epoch trained other shards
    assert read_paths(counter, urls) == trained


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_second_start_reads_no_shard_to_count_it(tmp_path, fmt):
    urls = tallied(write_shards(str(tmp_path), fmt))
    with bytes_read() as counter:
        first = ShardedStream(urls, FORMATS[fmt][1]).lengths()
    assert first == [ITEMS] * SHARDS
    assert read_paths(counter, urls) == set(range(SHARDS))  # counted once each
    with bytes_read() as counter:
        assert ShardedStream(urls, FORMATS[fmt][1]).lengths() == first
    assert read_paths(counter, urls) == set()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_resume_on_s3_reads_only_the_shards_it_trains_from(s3_bucket, s3_tally, fmt):  # noqa: F811
    urls = write_shards(f"{s3_bucket}/data", fmt)
    state, rest = half_epoch_state(urls, fmt)
    s3_tally.clear()
    loader = loader_of(urls, fmt)
    loader.load_state_dict(state)
    assert list(loader) == rest
    assert read_paths(s3_tally, urls) == {shard for batch in rest for shard in batch}


def test_a_second_start_on_s3_reads_no_shard_to_count_it(s3_bucket, s3_tally):  # noqa: F811
    urls = write_shards(f"{s3_bucket}/data", "jsonl")
    assert ShardedStream(urls, JsonlReader()).lengths() == [ITEMS] * SHARDS
    s3_tally.clear()
    assert ShardedStream(urls, JsonlReader()).lengths() == [ITEMS] * SHARDS
    assert not s3_tally


def test_a_shard_rewritten_on_s3_with_another_count_is_refused_at_resume(s3_bucket):  # noqa: F811
    urls = write_shards(f"{s3_bucket}/data", "jsonl")
    state, _ = half_epoch_state(urls, "jsonl")
    write(urls[6], _jsonl(6, ITEMS + 1))
    with pytest.raises(ResumeStateError, match="saved for shards of other item counts"):
        loader_of(urls, "jsonl").load_state_dict(state)


def test_a_shard_grown_since_is_counted_again_and_the_resume_refused(tmp_path):
    urls = tallied(write_shards(str(tmp_path), "jsonl"))
    state, _ = half_epoch_state(urls, "jsonl")
    path = fsspec.core.url_to_fs(urls[6])[1]
    with open(path, "ab") as file:
        file.write(json.dumps({"shard": 6, "item": ITEMS}).encode() + b"\n")
    with bytes_read() as counter:
        with pytest.raises(ResumeStateError, match=re.escape(
                "loader state entry 'rank_0' stream field 'canonical' was saved for shards of other item counts")):
            loader_of(urls, "jsonl").load_state_dict(state)
    assert read_paths(counter, urls) == {6}  # counted again: that shard alone


def test_a_shard_rewritten_with_the_same_count_is_counted_again_and_resumes(tmp_path):
    urls = tallied(write_shards(str(tmp_path), "jsonl"))
    state, rest = half_epoch_state(urls, "jsonl")
    path = fsspec.core.url_to_fs(urls[2])[1]
    stat = os.stat(path)
    Path(path).write_bytes(_jsonl(2, ITEMS))  # the same bytes, written again: a new modification
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with the old modification time
    with bytes_read() as counter:
        stream = ShardedStream(urls, JsonlReader(), window=4, seed=5)
        assert stream.lengths() == [ITEMS] * SHARDS
    assert read_paths(counter, urls) == {2}
    loader = ResumableDataLoader(stream, batch_size=BATCH, collate_fn=collate)
    loader.load_state_dict(state)
    assert list(loader) == rest
