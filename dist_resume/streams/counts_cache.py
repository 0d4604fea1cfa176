"""Shard item counts kept between the starts of a job: one small JSON file per shard list
and reader, in a folder (a local path or any fsspec URL), each count bound to its shard's
identity (`shard_identity`), so that a later start or resume learns the counts of
unchanged shards without reading them.

The file is a cache, never a source of truth for a changed shard: an entry is used only
for a shard whose identity is the one recorded with it. A file that cannot be read or
does not hold what this module writes (another format, damaged, too large for its shard
count) is passed over with a warning and written again; a file that cannot be written is
a warning too. It holds no URL (a shard's URL may carry a secret): its entries are in
the order of the shard list, whose digest names the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from dist_resume.storage import open_store, resolve, retry
from dist_resume.streams.shard_identity import NO_IDENTITY

ENVIRONMENT = "DIST_RESUME_COUNTS_CACHE"  # the default folder; empty: keep no counts
FORMAT = "dist-resume shard counts"
_ENTRY_BYTES = 48  # at most, as written: two 63-bit integers and punctuation
_INT64 = 2**63


def default_folder() -> str | None:
    """`$DIST_RESUME_COUNTS_CACHE` (empty: None), else `dist-resume/shard-counts` in the
    user's cache folder (`$XDG_CACHE_HOME`, default `~/.cache`)."""
    if ENVIRONMENT in os.environ:
        return os.environ[ENVIRONMENT] or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dist-resume", "shard-counts")


def _version() -> str:
    try:
        return metadata.version("dist-resume")
    except metadata.PackageNotFoundError:
        return "unknown"


class CountsCache:
    """The kept counts of `shards` as read by the reader of digest `reader_digest`, in the
    folder `folder` (opened with `storage_options`). The library's version is part of the
    file's name: a new version, whose readers may count otherwise, counts again."""

    def __init__(self, folder: str, shards: Sequence[str], reader_digest: int,
                 storage_options: dict[str, Any]) -> None:
        key = hashlib.blake2b("\n".join([FORMAT, _version(), str(reader_digest), *shards]).encode(),
                              digest_size=16).hexdigest()
        self._key = key
        self._shards = len(shards)
        self._folder = resolve(folder, storage_options)
        self._location = resolve(f"{folder.rstrip('/')}/{key}.json", storage_options)

    @property
    def url(self) -> str:
        """Where the counts are kept (secrets removed)."""
        return self._location.url

    @property
    def shared(self) -> bool:
        """Whether every node reads the same file (it is not on this machine's disk)."""
        return not self._location.is_local

    def read(self) -> list[tuple[int, int] | None]:
        """Each shard's kept (identity, count), None where nothing usable is kept."""
        nothing: list[tuple[int, int] | None] = [None] * self._shards
        limit = 256 + _ENTRY_BYTES * self._shards
        location = self._location
        try:
            if location.is_local and not stat.S_ISREG(os.stat(location.root).st_mode):
                raise ValueError("it is not a regular file")
            data = retry(location.fs.cat_file, location.root, start=0, end=limit + 1)
        except (FileNotFoundError, NotADirectoryError):  # nothing kept yet
            return nothing
        except Exception as exc:
            self._warn(f"cannot be read ({type(exc).__name__}: {location.redact(str(exc))})")
            return nothing
        try:
            if len(data) > limit:
                raise ValueError(f"it holds more than {limit} bytes")
            return self._entries(json.loads(data))
        except (ValueError, RecursionError) as exc:
            self._warn(f"does not hold counts of these shards ({exc})")
            return nothing

    def write(self, entries: Sequence[tuple[int, int]]) -> None:
        """Keep each shard's (identity, count); a shard of `NO_IDENTITY` is not kept."""
        listed = [[identity, count] if identity != NO_IDENTITY else None for identity, count in entries]
        document = {"format": FORMAT, "key": self._key, "entries": listed, "check": self._check(listed)}
        try:
            store = open_store(self._folder)
            store.ensure_directory(self._folder.root)
            store.overwrite(self._location.root, json.dumps(document, separators=(",", ":")).encode())
        except Exception as exc:
            self._warn(f"cannot be written, so the next start counts the shards again ({exc})")

    def _entries(self, document: Any) -> list[tuple[int, int] | None]:
        if not isinstance(document, dict) or document.get("format") != FORMAT or document.get("key") != self._key:
            raise ValueError("another format or shard list")
        listed = document.get("entries")
        if not isinstance(listed, list) or len(listed) != self._shards:
            raise ValueError(f"not {self._shards} entries")
        if document.get("check") != self._check(listed):
            raise ValueError("its check digest does not match its entries: damaged")
        entries: list[tuple[int, int] | None] = []
        for entry in listed:
            if entry is None:
                entries.append(None)
            elif (isinstance(entry, list) and len(entry) == 2
                  and all(type(value) is int and 0 <= value < _INT64 for value in entry)):
                entries.append((entry[0], entry[1]))
            else:
                raise ValueError(f"entry {entry!r:.40} is not two integers in [0, 2**63)")
        return entries

    def _check(self, listed: list[Any]) -> str:
        text = json.dumps([self._key, listed], separators=(",", ":")).encode()
        return hashlib.blake2b(text, digest_size=16).hexdigest()

    def _warn(self, what: str) -> None:
        warnings.warn(f"ShardedStream: the shard counts kept at {self.url} {what}", stacklevel=4)


def counts_cache(setting: Any, shards: Sequence[str], reader: Any,
                 storage_options: dict[str, Any]) -> CountsCache | None:
    """The cache a stream's `counts_cache` setting names (True: `default_folder()`; a path
    or URL; None or False: none), for a reader whose `digest` identifies its counting (a
    reader without one, identified by its name alone, may count otherwise from one
    configuration or version of its code to the next: its counts are not kept)."""
    digest = getattr(reader, "digest", None)
    if setting is None or setting is False or not isinstance(digest, int) or isinstance(digest, bool):
        return None
    folder = default_folder() if setting is True else os.fspath(setting)
    if folder is None:
        return None
    return CountsCache(folder, shards, digest, storage_options)

