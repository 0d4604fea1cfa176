"""Parquet shards, one row group at a time, through pyarrow (the `parquet` extra)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from dist_resume.streams.formats.digest import ConfiguredDigest
from dist_resume.streams.formats.naming import file_name


def pyarrow_parquet() -> Any:
    """``pyarrow.parquet``, imported on first use: only Parquet shards need it."""
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise ImportError("ParquetReader needs pyarrow: pip install 'dist-resume[parquet]'") from None
    return parquet


@dataclass(frozen=True)
class ParquetReader(ConfiguredDigest):
    """Reads a Parquet shard row group by row group: the footer first, then each row group's
    column chunks by range (only `columns`, all when None), so memory holds one row group.

    Yields each row as a dict of column -> value, in file order; with `batches=True`, one
    `pyarrow.RecordBatch` per non-empty row group instead. A column the shard lacks is a
    `ValueError` naming the file and the columns it has."""

    draws_randomness = False  # ShardedStream reads it without seeding the global generators

    columns: Sequence[str] | None = None
    batches: bool = False

    def __post_init__(self) -> None:
        if self.columns is not None:
            if isinstance(self.columns, str) or not all(isinstance(column, str) for column in self.columns):
                raise TypeError("columns must be a sequence of column names, or None for all")
            object.__setattr__(self, "columns", tuple(self.columns))  # hashable, and one repr for a list or tuple

    def __call__(self, file: BinaryIO) -> Iterator[Any]:
        # Closed here and read on this thread: an Arrow reader whose threads outlive it into
        # the interpreter's exit aborts the process ("terminate called without an active
        # exception", apache/arrow#34314); a loader worker reads on one thread anyway.
        with pyarrow_parquet().ParquetFile(file) as shard:
            columns = self._checked_columns(shard, file)
            for index in range(shard.num_row_groups):
                table = shard.read_row_group(index, columns=columns, use_threads=False)
                if not self.batches:
                    yield from table.to_pylist()
                elif table.num_rows:
                    yield from table.combine_chunks().to_batches()  # one batch: the columns are single chunks

    def count(self, file: BinaryIO) -> int:
        """The number of items, from the footer alone: rows, or non-empty row groups with `batches`."""
        with pyarrow_parquet().ParquetFile(file) as shard:
            metadata = shard.metadata
        if self.batches:
            return sum(1 for index in range(metadata.num_row_groups) if metadata.row_group(index).num_rows)
        return metadata.num_rows

    def _checked_columns(self, shard: Any, file: BinaryIO) -> list[str] | None:
        if self.columns is None:
            return None
        names = shard.schema_arrow.names
        missing = [column for column in self.columns if column not in names]
        if missing:
            raise ValueError(f"{file_name(file)}: no column {', '.join(map(repr, missing))} in this Parquet shard "
                             f"(its columns: {', '.join(map(repr, names))})")
        return list(self.columns)
