"""A Hugging Face dataset's data files read as ShardedStream shards (issue 21 point 5):
`hf_stream` takes `load_dataset`'s arguments and yields the records that
`load_dataset(..., streaming=True)` streams, now resuming exactly at another world size.
Local data files only (no Hub access)."""

from __future__ import annotations

import json
import os
import re

import pytest

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets  # noqa: E402

from dist_resume import ResumableDataLoader  # noqa: E402
from dist_resume.streams.formats import JsonlReader, ParquetReader, WebDatasetReader, hf_stream  # noqa: E402

from .format_files import jsonl_bytes, parquet_bytes, tar_bytes, write  # noqa: E402


SHARDS = 6


def key(record: dict) -> str:
    return json.dumps(record, sort_keys=True, default=repr)


@pytest.fixture
def jsonl_folder(tmp_path):
    for shard in range(SHARDS):  # 21 records: 3 batches of 3, then 2 global batches of 2 x 3
        write(f"{tmp_path}/part-{shard}.jsonl", jsonl_bytes([{"id": shard * 100 + i, "text": f"t{i}"} for i in range(shard + 1)]))
    return str(tmp_path)


def test_a_folder_of_jsonl_files_streams_the_same_records(jsonl_folder):
    stream = hf_stream(jsonl_folder)
    assert stream.shards == sorted(f"{jsonl_folder}/part-{shard}.jsonl" for shard in range(SHARDS))
    assert stream.reader == JsonlReader()
    hf_records = datasets.load_dataset(jsonl_folder, split="train", streaming=True)
    assert sorted(map(key, stream)) == sorted(map(key, hf_records))


def test_parquet_data_files_with_columns(tmp_path):
    files = [write(f"{tmp_path}/{name}.parquet", parquet_bytes([{"id": i, "text": name} for i in range(6)], 4))
             for name in ("a", "b")]
    stream = hf_stream("parquet", data_files={"train": files}, columns=["id"], shuffle=False)
    assert stream.reader == ParquetReader(columns=["id"])
    hf_records = datasets.load_dataset("parquet", data_files={"train": files}, columns=["id"], split="train", streaming=True)
    assert list(stream) == list(hf_records) == [{"id": i} for i in range(6)] * 2


def test_webdataset_tar_samples_have_the_same_keys(tmp_path):
    files = [write(f"{tmp_path}/{shard}.tar",
                   tar_bytes([member for i in range(3) for member in ((f"{shard}{i}.txt", b"x"), (f"{shard}{i}.cls", b"1"))]))
             for shard in "ab"]
    stream = hf_stream("webdataset", data_files={"train": files}, shuffle=False)
    assert stream.reader == WebDatasetReader()
    assert list(stream)[0] == {"__key__": "a0", "txt": b"x", "cls": b"1"}
    hf_records = datasets.load_dataset("webdataset", data_files={"train": files}, split="train", streaming=True)
    assert [sample["__key__"] for sample in stream] == [sample["__key__"] for sample in hf_records]


def test_an_elastic_resume_reads_every_record_once(jsonl_folder):
    """Stopped at world size 1 with 2 workers, resumed at world size 2 without workers."""
    stream = hf_stream(jsonl_folder, window=4, seed=3)
    first = ResumableDataLoader(stream, batch_size=3, num_workers=2, collate_fn=list)
    iterator = iter(first)
    consumed = [record["id"] for _ in range(3) for record in next(iterator)]
    state = first.state_dict()
    del iterator
    for rank in range(2):
        loader = ResumableDataLoader(stream, batch_size=3, collate_fn=list, rank=rank, world_size=2)
        loader.load_state_dict(state)
        consumed += [record["id"] for batch in loader for record in batch]
    assert sorted(consumed) == [shard * 100 + i for shard in range(SHARDS) for i in range(shard + 1)]


def test_other_formats_and_missing_splits_are_refused(tmp_path, jsonl_folder):
    csv = write(f"{tmp_path}/a.csv", b"id\n1\n")
    with pytest.raises(ValueError, match=re.escape("hf_stream reads the formats json, parquet, webdataset; 'csv' is read by the 'csv' builder")):
        hf_stream("csv", data_files=[csv])
    with pytest.raises(ValueError, match=re.escape(f"{jsonl_folder!r} has no data files for split 'test' (its splits: 'train')")):
        hf_stream(jsonl_folder, split="test")
    with pytest.raises(ValueError, match=re.escape("hf_stream reads JSON Lines files; field='rows' (records inside one JSON document)")):
        hf_stream("json", data_files=[f"{jsonl_folder}/part-0.jsonl"], field="rows")
