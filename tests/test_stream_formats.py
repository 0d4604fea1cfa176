"""The shard format readers (issue 21 point 5) on local files: what each yields, its edge
cases with their exact errors, `count` equal to the items read, and reading that streams
(never a whole shard before the first item)."""

from __future__ import annotations

import io
import random
import re
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dist_resume import ResumableDataLoader, ResumeStateError
from dist_resume.streams import ShardedStream
from dist_resume.streams.formats import JsonlReader, ParquetReader, WebDatasetReader
from dist_resume.streams.formats.jsonl import numbered_lines

from .format_files import CountingFile, jsonl_bytes, parquet_bytes, tar_bytes, write


def read_and_count(reader, data: bytes) -> tuple[list, int]:
    return list(reader(CountingFile(data))), reader.count(CountingFile(data))


# JSON Lines

def test_jsonl_yields_each_line_parsed_in_order():
    items = [{"id": i, "text": "é" * i} for i in range(5)] + [[1, 2], "s", 3, None]
    assert read_and_count(JsonlReader(), jsonl_bytes(items)) == (items, len(items))


@pytest.mark.parametrize("data, items", [
    (b"", []),
    (b"\n", []),
    (b"1\n2", [1, 2]),  # no newline after the last line
    (b"1\n2\n\n  \n", [1, 2]),  # blank trailing lines
    (b"1\r\n\r\n2\r\n", [1, 2]),  # CRLF, a blank line between
])
def test_jsonl_blank_lines_hold_no_item(data, items):
    assert read_and_count(JsonlReader(), data) == (items, len(items))


def test_jsonl_malformed_line_is_an_error_naming_file_and_line():
    reader = JsonlReader()
    items = reader(CountingFile(b'{"a": 1}\n\n{"a": 2}\n{"a": \n{"a": 4}\n'))
    assert next(items) == {"a": 1} and next(items) == {"a": 2}
    message = "mem://shard: line 4 is not valid JSON (Expecting value at column 7)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        next(items)


def test_jsonl_undecodable_line_is_an_error_naming_the_line():
    with pytest.raises(ValueError, match=re.escape("mem://shard: line 2 is not valid utf-8 (byte 3: invalid start byte)")):
        list(JsonlReader()(CountingFile(b'"a"\n"b\xff"\n')))
    assert list(JsonlReader(encoding="latin-1")(CountingFile(b'"a"\n"b\xff"\n'))) == ["a", "bÿ"]


@given(st.lists(st.sampled_from([b"", b" ", b"1", b"[2]", b'"x y"', b"\r"]), max_size=30), st.integers(1, 7))
def test_jsonl_lines_across_any_chunking(pieces, chunk):
    """Lines split across read chunks come out whole, numbered as the file numbers them."""
    data = b"\n".join(pieces)
    expected = [(number, line) for number, line in enumerate(data.split(b"\n"), 1) if line.strip()]
    assert list(numbered_lines(io.BytesIO(data), chunk)) == expected
    assert read_and_count(JsonlReader(), data)[1] == len(expected)


def test_jsonl_streams_the_shard():
    data = jsonl_bytes(range(500_000))  # 3.4 MB
    file = CountingFile(data)
    assert next(JsonlReader()(file)) == 0
    assert file.bytes_read <= len(data) // 3


# Parquet

ROWS = [{"id": i, "text": f"row {i}", "blob": bytes(100)} for i in range(10)]


def test_parquet_rows_of_several_row_groups():
    data = parquet_bytes(ROWS, row_group_size=3)
    assert read_and_count(ParquetReader(), data) == (ROWS, 10)


def test_parquet_column_selection():
    data = parquet_bytes(ROWS, row_group_size=4)
    expected = [{"text": row["text"], "id": row["id"]} for row in ROWS]
    items, count = read_and_count(ParquetReader(columns=["text", "id"]), data)
    assert (items, count) == (expected, 10) and list(items[0]) == ["text", "id"]
    assert ParquetReader(columns=["text", "id"]) == ParquetReader(columns=("text", "id"))


def test_parquet_record_batches_one_per_row_group():
    data = parquet_bytes(ROWS, row_group_size=4)
    batches, count = read_and_count(ParquetReader(columns=["id"], batches=True), data)
    assert [batch.to_pydict() for batch in batches] == [{"id": [0, 1, 2, 3]}, {"id": [4, 5, 6, 7]}, {"id": [8, 9]}]
    assert count == 3


def test_parquet_empty_shard():
    import pyarrow as pa

    data = parquet_bytes([], row_group_size=4, schema=pa.schema([("id", pa.int64())]))
    assert read_and_count(ParquetReader(), data) == ([], 0)
    assert read_and_count(ParquetReader(batches=True), data) == ([], 0)


def test_parquet_missing_column_is_named():
    message = "mem://shard: no column 'label' in this Parquet shard (its columns: 'id', 'text', 'blob')"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        list(ParquetReader(columns=["id", "label"])(CountingFile(parquet_bytes(ROWS, 4))))
    with pytest.raises(TypeError, match="^columns must be a sequence of column names, or None for all$"):
        ParquetReader(columns="id")


def test_parquet_reads_only_the_selected_columns():
    draw = random.Random(0)
    rows = [{"id": i, "blob": draw.randbytes(10_000)} for i in range(200)]  # 2 MB that do not compress
    data = parquet_bytes(rows, row_group_size=50)
    file = CountingFile(data)
    assert [row["id"] for row in ParquetReader(columns=["id"])(file)] == list(range(200))
    assert file.bytes_read < len(data) // 20


def test_parquet_without_pyarrow_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=re.escape("ParquetReader needs pyarrow: pip install 'dist-resume[parquet]'")):
        list(ParquetReader()(CountingFile(b"")))


# WebDataset tar

def test_tar_samples_grouped_by_key_across_members():
    members = [("a/0001.jpg", b"j1"), ("a/0001.json", b"{}"), ("a/0001.seg.png", b"p1"),
               ("a/0002.jpg", b"j2"), ("b/0001.jpg", b"j3")]
    expected = [{"__key__": "a/0001", "jpg": b"j1", "json": b"{}", "seg.png": b"p1"},
                {"__key__": "a/0002", "jpg": b"j2"}, {"__key__": "b/0001", "jpg": b"j3"}]
    for mode in ("w", "w:gz"):
        data = tar_bytes(members, mode, directories=["a", "b"])
        assert read_and_count(WebDatasetReader(), data) == (expected, 3)


def test_tar_empty_shard():
    assert read_and_count(WebDatasetReader(), tar_bytes([])) == ([], 0)


@pytest.mark.parametrize("members, message", [
    ([("a.jpg", b""), ("README", b"")], "tar member 'README' is not named key.extension, as the files of WebDataset samples are"),
    ([("dir/.hidden", b"")], "tar member 'dir/.hidden' is not named key.extension"),
    ([("a.jpg", b""), ("a.jpg", b"")], "tar member 'a.jpg' repeats extension 'jpg' of sample 'a'"),
    ([("a.jpg", b""), ("b.jpg", b""), ("a.txt", b"")],
     "tar member 'a.txt' comes back to sample 'a' after other samples; the files of one sample must be consecutive"),
    ([("a.__key__", b"")], "tar member 'a.__key__' has extension '__key__', which names a sample's key"),
])
def test_tar_misnamed_members_are_errors(members, message):
    data = tar_bytes(members)
    for call in (lambda: list(WebDatasetReader()(CountingFile(data))), lambda: WebDatasetReader().count(CountingFile(data))):
        with pytest.raises(ValueError, match=f"^{re.escape('mem://shard: ' + message)}"):
            call()


NAMES = st.lists(st.tuples(st.sampled_from(["a", "b", "d/a", "c"]), st.sampled_from(["jpg", "txt", "x.y"])), max_size=12)


@given(NAMES)
def test_tar_count_equals_the_samples_read(pairs):
    """Whatever the member names: `count` equals the samples read, each sample holds its
    consecutive members, or both refuse the shard with the same error."""
    members = [(f"{key}.{extension}", f"{index}".encode()) for index, (key, extension) in enumerate(pairs)]
    data = tar_bytes(members)
    try:
        samples = list(WebDatasetReader()(CountingFile(data)))
    except ValueError as error:
        with pytest.raises(ValueError, match=f"^{re.escape(str(error))}$"):
            WebDatasetReader().count(CountingFile(data))
        return
    assert WebDatasetReader().count(CountingFile(data)) == len(samples)
    rebuilt = [(f"{sample['__key__']}.{extension}", data) for sample in samples
               for extension, data in sample.items() if extension != "__key__"]
    assert rebuilt == members


def test_tar_streams_the_shard():
    data = tar_bytes([(f"{index:04}.bin", bytes(10_000)) for index in range(200)])
    file = CountingFile(data)
    assert next(WebDatasetReader()(file))["__key__"] == "0000"
    assert file.bytes_read <= len(data) // 4


def test_a_shard_is_named_by_the_path_or_url_it_was_opened_with(tmp_path):
    path = write(f"{tmp_path}/bad.jsonl", b"1\n{\n")
    for url in (path, f"file://{path}"):
        with pytest.raises(ValueError, match=f"^{re.escape(path)}: line 2 is not valid JSON"):
            list(ShardedStream([url], JsonlReader()))


def test_a_state_read_with_other_columns_is_refused(tmp_path):
    """The readers' digest is their configuration: item counts saved for one column
    selection never resume another."""
    url = write(f"{tmp_path}/rows.parquet", parquet_bytes(ROWS, 4))
    saved = ResumableDataLoader(ShardedStream([url], ParquetReader(columns=["id"])), batch_size=2, collate_fn=list)
    next(iter(saved))
    state = saved.state_dict()
    same = ResumableDataLoader(ShardedStream([url], ParquetReader(columns=("id",))), batch_size=2, collate_fn=list)
    same.load_state_dict(state)
    other = ResumableDataLoader(ShardedStream([url], ParquetReader(columns=["text"])), batch_size=2, collate_fn=list)
    message = (f"loader state entry 'rank_0' stream field 'canonical' was saved with another reader (digest "
               f"{ParquetReader(columns=['id']).digest}); this ShardedStream's reader has digest "
               f"{ParquetReader(columns=['text']).digest}")
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        other.load_state_dict(state)
