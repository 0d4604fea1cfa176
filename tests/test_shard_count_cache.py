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
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
    state = loader.state_dict()
    # run the epoch out: an abandoned iterator's open of the next shard would finish in the
    # background, inside a caller's count of the bytes read
    assert list(iterator) == batches[len(batches) // 2:]
    return state, batches[len(batches) // 2:]


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


# The counts cache as a mechanism: where it is, what it keeps, and any file found in its place

def cache_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.json"))


def test_the_default_folder_is_the_users_cache(monkeypatch, tmp_path):
    from dist_resume.streams.counts_cache import default_folder

    monkeypatch.delenv("DIST_RESUME_COUNTS_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_folder() == str(tmp_path / "dist-resume" / "shard-counts")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_folder() == os.path.expanduser("~/.cache/dist-resume/shard-counts")
    monkeypatch.setenv("DIST_RESUME_COUNTS_CACHE", "")
    assert default_folder() is None


@pytest.mark.parametrize("setting", ["none", "empty environment", "reader without digest"])
def test_counts_not_kept_are_counted_at_every_start(tmp_path, monkeypatch, counts_cache, setting):
    urls = tallied(write_shards(str(tmp_path), "jsonl"))
    options: dict[str, Any] = {"counts_cache": None} if setting == "none" else {}
    if setting == "empty environment":
        monkeypatch.setenv("DIST_RESUME_COUNTS_CACHE", "")
    reader = (lambda file: JsonlReader()(file)) if setting == "reader without digest" else JsonlReader()
    for _ in range(2):
        with bytes_read() as counter:
            assert ShardedStream(urls, reader, **options).lengths() == [ITEMS] * SHARDS
        assert read_paths(counter, urls) == set(range(SHARDS))
    assert not counts_cache.exists()


def test_counts_are_kept_in_a_folder_given_by_url(tmp_path, s3_bucket, s3_tally):  # noqa: F811
    urls = tallied(write_shards(str(tmp_path), "jsonl"))
    folder = f"{s3_bucket}/counts"
    assert ShardedStream(urls, JsonlReader(), counts_cache=folder).lengths() == [ITEMS] * SHARDS
    with bytes_read() as counter:
        assert ShardedStream(urls, JsonlReader(), counts_cache=folder).lengths() == [ITEMS] * SHARDS
    assert read_paths(counter, urls) == set()
    assert len(fsspec.filesystem("s3").ls(folder)) == 1


def test_a_store_that_reports_no_version_of_a_shard_is_counted_at_every_start(counts_cache):
    urls = write_shards("memory://dist-resume-no-identity", "jsonl")  # memory:// reports a size alone
    fs = fsspec.filesystem("memory")
    assert ShardedStream(urls, JsonlReader()).lengths() == [ITEMS] * SHARDS
    fs.pipe(urls[0], _jsonl(0, ITEMS - 1))  # the same URL, other bytes: nothing would tell it from the first
    assert ShardedStream(urls, JsonlReader()).lengths() == [ITEMS - 1] + [ITEMS] * (SHARDS - 1)
    fs.rm("/dist-resume-no-identity", recursive=True)


def test_counts_of_another_configuration_are_not_taken(tmp_path, counts_cache):
    """The cache's file is named by the reader's digest: ParquetReader(batches=True) counts row groups."""
    urls = write_shards(str(tmp_path), "parquet")
    assert ShardedStream(urls, ParquetReader()).lengths() == [ITEMS] * SHARDS
    assert ShardedStream(urls, ParquetReader(batches=True)).lengths() == [3] * SHARDS
    assert len(cache_files(counts_cache)) == 2


def test_a_folder_that_cannot_be_written_is_a_warning(tmp_path):
    urls = write_shards(str(tmp_path), "jsonl")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.warns(UserWarning, match=re.escape(
            f"ShardedStream: the shard counts kept at {blocked}/") + r"[0-9a-f]{32}\.json cannot be written, so "
            "the next start counts the shards again"):
        assert ShardedStream(urls, JsonlReader(), counts_cache=str(blocked)).lengths() == [ITEMS] * SHARDS


def test_a_cache_file_that_is_a_fifo_is_passed_over(tmp_path, counts_cache):
    urls = write_shards(str(tmp_path), "jsonl")
    ShardedStream(urls, JsonlReader()).lengths()
    (path,) = cache_files(counts_cache)
    path.unlink()
    os.mkfifo(path)
    with pytest.warns(UserWarning, match="cannot be read .*it is not a regular file"):
        assert ShardedStream(urls, JsonlReader()).lengths() == [ITEMS] * SHARDS


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_whatever_the_cache_file_holds_the_counts_are_the_shards(tmp_path_factory, data):
    """Any bytes in place of the cache's file (random, or the file written with one value
    changed, an entry dropped, a digest edited): the counts are the shards' own, the file is
    used only when it is what was written, and anything else is one warning and a count."""
    root = tmp_path_factory.mktemp("shards")
    folder = root / "counts"
    urls = tallied(write_shards(str(root), "jsonl", items=3))
    lengths = ShardedStream(urls, JsonlReader(), counts_cache=str(folder)).lengths()
    (path,) = cache_files(folder)
    written = json.loads(path.read_text())
    edits = {
        "random bytes": lambda: data.draw(st.binary(max_size=300)),
        "a count": lambda: _edited(written, ["entries", data.draw(st.integers(0, SHARDS - 1)), 1],
                                   data.draw(st.integers(0, 2**63 - 1))),
        "an identity": lambda: _edited(written, ["entries", data.draw(st.integers(0, SHARDS - 1)), 0],
                                       data.draw(st.integers(-2, 2**64))),
        "the check": lambda: _edited(written, ["check"], data.draw(st.text(max_size=40))),
        "the key": lambda: _edited(written, ["key"], data.draw(st.text(max_size=40))),
        "an entry dropped": lambda: _edited(written, ["entries"], written["entries"][1:]),
        "nested": lambda: b"[" * data.draw(st.integers(1, 100_000)),
        "unchanged": lambda: json.dumps(written).encode(),
    }
    edit = data.draw(st.sampled_from(sorted(edits)))
    path.write_bytes(edits[edit]())
    with bytes_read() as counter, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stream = ShardedStream(urls, JsonlReader(), counts_cache=str(folder))
        assert stream.lengths() == lengths
    if edit == "unchanged":
        assert not caught and not counter
    else:
        assert [str(warning.message)[:60] for warning in caught] in ([], [f"ShardedStream: the shard counts kept at {path}"[:60]])


def _edited(document: dict[str, Any], path: list[Any], value: Any) -> bytes:
    edited = json.loads(json.dumps(document))
    place = edited
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    return json.dumps(edited).encode()
