"""Readers of the shard formats people store, for `ShardedStream`: JSON Lines
(`JsonlReader`), Parquet row groups (`ParquetReader`, through pyarrow, imported only when
used), WebDataset tar samples (`WebDatasetReader`, which parses tar headers itself:
`tar_headers`, `tar_members`, `tar_stream`), and `hf_stream`, which reads the data
files of a Hugging Face dataset as shards. Each reader streams the file object it is given
(never a whole shard fetched first) and has a `count` that learns a shard's item count
without building items. Imports `storage` (to name files without secrets) and the stream
classes of `streams`; never the loader."""

from dist_resume.streams.formats.hugging_face import hf_stream
from dist_resume.streams.formats.jsonl import JsonlReader
from dist_resume.streams.formats.parquet import ParquetReader
from dist_resume.streams.formats.webdataset import WebDatasetReader

__all__ = ["JsonlReader", "ParquetReader", "WebDatasetReader", "hf_stream"]
