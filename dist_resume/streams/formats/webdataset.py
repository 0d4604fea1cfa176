"""WebDataset tar shards: consecutive files ``key.ext`` of one key form one sample."""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from dist_resume.streams.formats.digest import ConfiguredDigest
from dist_resume.streams.formats.naming import file_name
from dist_resume.streams.formats.tar_members import COUNT_BYTES, READ_BYTES, tar_members
from dist_resume.streams.formats.tar_stream import tar_stream


class SampleKeys:
    """WebDataset's grouping rule over a tar's file names, in order: a name is ``key.ext``
    (the key ends at the first dot of the file's base name, directories included in it);
    consecutive names of one key are one sample. Anything else is a `ValueError`, so no file
    is dropped or merged into a wrong sample without a word."""

    def __init__(self, where: str) -> None:
        self._where = where
        self._current: str | None = None
        self._prefix = "\0"  # the current key and its dot; no name starts with a NUL
        self._extensions: set[str] = set()
        self._done: set[str] = set()

    def place(self, name: str) -> tuple[str, str, bool]:
        """(key, extension, whether this name starts a new sample)."""
        if name.startswith(self._prefix):  # the next file of the current sample (the usual case)
            extension = name[len(self._prefix):]
            if extension and "/" not in extension and extension != "__key__" and extension not in self._extensions:
                self._extensions.add(extension)
                return self._current, extension, False
        cut = name.rfind("/") + 1
        if cut > 1 and name[cut - 2] == "/":  # slashes to collapse: posixpath's rules
            directory, base = posixpath.split(name)
            head = posixpath.join(directory, "")
        else:
            head, base = name[:cut], name[cut:]
        stem, dot, extension = base.partition(".")
        if not stem or not dot or not extension:
            raise ValueError(f"{self._where}: tar member {name!r} is not named key.extension, as the files of "
                             "WebDataset samples are")
        if extension == "__key__":
            raise ValueError(f"{self._where}: tar member {name!r} has extension '__key__', which names a sample's key")
        key = head + stem
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
        self._current, self._prefix, self._extensions = key, f"{key}.", {extension}
        return key, extension, True


def count_samples(names: Iterable[str], where: str) -> int:
    """The number of samples the file names ``names`` (in tar order) make."""
    keys = SampleKeys(where)
    return sum(keys.place(name)[2] for name in names)


@dataclass(frozen=True)
class WebDatasetReader(ConfiguredDigest):
    """Reads a WebDataset tar shard (plain, or compressed with gzip, bzip2 or xz) as a stream,
    never extracting to disk: yields one dict per sample, ``{"__key__": key, ext: bytes, ...}``,
    as WebDataset groups ``key.ext`` files. Directories and links hold no sample data and
    are passed over; a file not named ``key.ext``, a repeated extension within a sample, or
    a key that comes back after other samples is a `ValueError` naming the file, and so is
    a damaged header, a member the reader does not read (a GNU sparse file, ...) and a size
    the shard does not hold (tar_members.py): never a wrong sample from them. Memory holds
    one sample and a block of the shard."""

    draws_randomness = False  # ShardedStream reads it without seeding the global generators

    def __call__(self, file: BinaryIO) -> Iterator[dict[str, Any]]:
        where = file_name(file)
        keys = SampleKeys(where)
        sample: dict[str, Any] = {}
        for name, data in tar_members(tar_stream(file, where, READ_BYTES), where, data=True):
            key, extension, starts = keys.place(name)
            if starts:
                if sample:
                    yield sample
                sample = {"__key__": key}
            sample[extension] = data
        if sample:
            yield sample

    def count(self, file: BinaryIO) -> int:
        """The number of samples, from the tar headers alone (member data is seeked over
        where the file can seek), refused as reading the shard would refuse it."""
        where = file_name(file)
        return count_samples((name for name, _ in tar_members(tar_stream(file, where, COUNT_BYTES), where, data=False)),
                             where)
