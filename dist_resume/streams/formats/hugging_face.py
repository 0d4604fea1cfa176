"""The data files of a Hugging Face dataset, read as the shards of a `ShardedStream`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dist_resume.streams.formats.jsonl import JsonlReader
from dist_resume.streams.formats.parquet import ParquetReader
from dist_resume.streams.formats.webdataset import WebDatasetReader
from dist_resume.streams.sharded import ShardedStream


def _json_reader(config: Any) -> JsonlReader:
    if getattr(config, "field", None) is not None:
        raise ValueError(f"hf_stream reads JSON Lines files; field={config.field!r} (records inside one JSON "
                         "document) is not a stream of lines")
    return JsonlReader(encoding=getattr(config, "encoding", None) or "utf-8")


def _parquet_reader(config: Any) -> ParquetReader:
    columns = getattr(config, "columns", None)
    return ParquetReader(columns=None if columns is None else list(columns))


READERS: dict[str, Callable[[Any], Any]] = {
    "json": _json_reader,
    "parquet": _parquet_reader,
    "webdataset": lambda config: WebDatasetReader(),
}


def hf_stream(path: str, *, data_files: Any = None, split: str = "train", shuffle: bool = True, window: int = 1024,
              seed: int = 0, storage_options: dict[str, Any] | None = None, **config_kwargs: Any) -> ShardedStream:
    """A `ShardedStream` over the data files that `datasets.load_dataset(path,
    data_files=data_files, split=split, streaming=True, **config_kwargs)` would stream:
    one shard per file, read by the reader of the dataset's format (JSON Lines,
    Parquet with the config's `columns`, WebDataset tar). Files are resolved by `datasets`
    (a local folder, a packaged builder with `data_files`, or a Hub repository); items are
    the files' records as they are stored (undecoded: no `Features` casting, tar members
    as bytes). Through `ResumableDataLoader` it resumes exactly at any world size,
    unlike the stream's own `state_dict`. Other formats are a `ValueError` naming the ones
    read."""
    try:
        import datasets
    except ImportError:
        raise ImportError("hf_stream needs Hugging Face datasets: pip install 'dist-resume[datasets]'") from None
    builder = datasets.load_dataset_builder(path, data_files=data_files, **config_kwargs)
    reader_for = READERS.get(builder.name)
    if reader_for is None:
        raise ValueError(f"hf_stream reads the formats {', '.join(sorted(READERS))}; {path!r} is read by the "
                         f"{builder.name!r} builder")
    files = builder.config.data_files or {}
    if split not in files:
        raise ValueError(f"{path!r} has no data files for split {split!r} (its splits: {', '.join(repr(str(name)) for name in files)})")
    return ShardedStream([str(file) for file in files[split]], reader_for(builder.config), shuffle=shuffle,
                         window=window, seed=seed, storage_options=storage_options)
