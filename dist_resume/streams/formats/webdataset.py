"""WebDataset tar shards: consecutive files ``key.ext`` of one key form one sample."""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from dist_resume.streams.formats.digest import ConfiguredDigest
from dist_resume.streams.formats.naming import file_name


class SampleKeys:
    """WebDataset's grouping rule over a tar's file names, in order: a name is ``key.ext``
    (the key ends at the first dot of the file's base name, directories included in it);
    consecutive names of one key are one sample. Anything else is a `ValueError`, so no file
    is dropped or merged into a wrong sample without a word."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._current: str | None = None
        self._extensions: set[str] = set()
        self._done: set[str] = set()

    def place(self, name: str) -> tuple[str, str, bool]:
        """(key, extension, whether this name starts a new sample)."""
        directory, base = posixpath.split(name)
        stem, dot, extension = base.partition(".")
        if not stem or not dot or not extension:
            raise ValueError(f"{self._where}: tar member {name!r} is not named key.extension, as the files of "
                             "WebDataset samples are")
        if extension == "__key__":
            raise ValueError(f"{self._where}: tar member {name!r} has extension '__key__', which names a sample's key")
        key = posixpath.join(directory, stem)
        if key == self._current:
            if extension in self._extensions:
                raise ValueError(f"{self._where}: tar member {name!r} repeats extension {extension!r} of sample {key!r}")
            self._extensions.add(extension)
            return key, extension, False
        if key in self._done:
            raise ValueError(f"{self._where}: tar member {name!r} comes back to sample {key!r} after other "
                             "samples; the files of one sample must be consecutive")
        if self._current is not None:
            self._done.add(self._current)
        self._current, self._extensions = key, {extension}
        return key, extension, True


def count_samples(names: Iterable[str], where: str) -> int:
    """The number of samples the file names ``names`` (in tar order) make."""
    keys = SampleKeys(where)
    return sum(keys.place(name)[2] for name in names)


@dataclass(frozen=True)
class WebDatasetReader(ConfiguredDigest):
    """Reads a WebDataset tar shard (plain, or compressed as tarfile reads it) as a stream,
    never extracting to disk: yields one dict per sample, ``{"__key__": key, ext: bytes, ...}``,
    as WebDataset groups ``key.ext`` files. Directories and links hold no sample data and
    are passed over; a file not named ``key.ext``, a repeated extension within a sample, or
    a key that comes back after other samples is a `ValueError` naming the file."""

    draws_randomness = False  # ShardedStream reads it without seeding the global generators

    def __call__(self, file: BinaryIO) -> Iterator[dict[str, Any]]:
        keys = SampleKeys(file_name(file))
        sample: dict[str, Any] = {}
        with tarfile.open(fileobj=file, mode="r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, extension, starts = keys.place(member.name)
                if starts and sample:
                    yield sample
                    sample = {}
                sample.setdefault("__key__", key)
                sample[extension] = tar.extractfile(member).read()
        if sample:
            yield sample

    def count(self, file: BinaryIO) -> int:
        """The number of samples, from the tar headers alone (member data is seeked over)."""
        with tarfile.open(fileobj=file, mode="r:*") as tar:
            return count_samples((member.name for member in tar if member.isfile()), file_name(file))
