"""Each shard format reader through ShardedStream on S3 (moto, then Ceph RGW): the items of
every shard in order, and `count` on the opened S3 file equal to the items read."""

from __future__ import annotations

import re

import fsspec
import pytest

from dist_resume.streams import ShardedStream
from dist_resume.streams.formats import JsonlReader, ParquetReader, WebDatasetReader
from dist_resume.streams.prefetch import ShardFiles

from .format_files import jsonl_bytes, parquet_bytes, tar_bytes, write
from .s3_server import s3_endpoint, s3_store  # noqa: F401


def jsonl_shard(shard: int) -> tuple[bytes, list]:
    items = [{"shard": shard, "index": i} for i in range(5 + shard)]
    return jsonl_bytes(items), items


def parquet_shard(shard: int) -> tuple[bytes, list]:
    rows = [{"shard": shard, "index": i, "text": "x" * i} for i in range(7 + shard)]
    return parquet_bytes(rows, row_group_size=3), [{"index": row["index"]} for row in rows]


def tar_shard(shard: int) -> tuple[bytes, list]:
    samples = [{"__key__": f"s{shard}/{i:03}", "jpg": bytes([i]) * 1000, "json": b"{}"} for i in range(4 + shard)]
    members = [(f"{sample['__key__']}.{ext}", sample[ext]) for sample in samples for ext in ("jpg", "json")]
    return tar_bytes(members), samples


FORMATS = {
    "jsonl": (JsonlReader(), jsonl_shard),
    "parquet": (ParquetReader(columns=["index"]), parquet_shard),
    "webdataset": (WebDatasetReader(), tar_shard),
}


@pytest.mark.parametrize("name", FORMATS)
def test_reader_on_s3(s3_store, name):  # noqa: F811
    reader, make = FORMATS[name]
    shards = [make(shard) for shard in range(3)]
    urls = [write(f"{s3_store}/{name}/{shard}.{name}", data) for shard, (data, _) in enumerate(shards)]
    assert list(ShardedStream(urls, reader, shuffle=False)) == [item for _, items in shards for item in items]
    for url, (_, items) in zip(urls, shards):
        with fsspec.open(url, "rb") as file:
            assert reader.count(file) == len(items)


def test_a_malformed_s3_shard_is_named_by_its_url(s3_store):  # noqa: F811
    url = write(f"{s3_store}/bad.jsonl", b'{"a": 1}\n{"a": 2\n')
    with pytest.raises(ValueError, match=f"^{re.escape(url)}: line 2 is not valid JSON \\(Expecting ',' delimiter at column 8\\)"):
        list(ShardedStream([url], JsonlReader()))


@pytest.mark.parametrize("name", FORMATS)
def test_reader_on_s3_past_the_head_fetched_ahead(s3_store, name):  # noqa: F811
    """A shard longer than the bytes fetched ahead: the rest is read from the S3 file (a
    Parquet footer from its end, a tar on from the head)."""
    reader, make = FORMATS[name]
    shards = [make(shard) for shard in range(2)]
    urls = [write(f"{s3_store}/{name}/{shard}.{name}", data) for shard, (data, _) in enumerate(shards)]
    with ShardFiles(urls, head_bytes=100) as files:
        for url, (data, items) in zip(urls, shards):
            assert len(data) > 100
            with files.open(url) as file:
                assert list(reader(file)) == items


def test_an_empty_s3_shard_is_read(s3_store):  # noqa: F811
    """S3 refuses every byte range of an empty object: its fetch ahead falls back to opening it."""
    urls = [write(f"{s3_store}/{name}.jsonl", jsonl_bytes(items)) for name, items in (("a", [1]), ("b", []), ("c", [2]))]
    assert list(ShardedStream(urls, JsonlReader(), shuffle=False)) == [1, 2]
