"""The run's index of committed steps: ``<url>/.commits/step_00000100.w4.b8346.t1764261437123456``
repeats step 100's commit marker with the size of its files, and its name says what
``list_checkpoints`` reports (world size 4, 8,346 bytes, committed at that microsecond), so
that listing a run reads no step's files. Entries named ``step_00000100`` alone (written
before names said more) are read, one request each.

The index saves requests; it decides nothing. A step is committed by its marker alone
(`step_dirs.read_commit`); an entry counts only where it matches its step's marker (the same
world size and commit time), and is ignored otherwise. Entries are written after the marker
and removed before it. Anything else in ``.commits/`` (a ``.DS_Store``, a Hadoop ``_SUCCESS``,
a crash's leftover) is ignored, and so is a ``.commits`` that is not a directory: it is never
read or written through a link.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Iterable
from typing import Any, NamedTuple

from dist_resume.checkpoint.bounded_files import read_whole
from dist_resume.checkpoint.marker import MARKER_LIMIT, parse_marker
from dist_resume.errors import CheckpointError
from dist_resume.storage import DIRECTORY, LINK, FILE, CheckpointStore

INDEX_DIR = ".commits"
# Bounded digit counts: a name never stands for a number too large to convert.
_ENTRY = re.compile(r"step_(\d{8,})(?:\.w(\d{1,7})\.b(\d{1,19})\.t(\d{1,17})(?:\.m([0-9a-f]{32}))?)?", re.ASCII)


class Summary(NamedTuple):
    """What an index entry's name says of its step."""

    world_size: int
    size_bytes: int
    committed_at: float  # seconds since the epoch, to the microsecond
    marker_md5: str | None = None  # of the marker's bytes (in names written since markers are vouched by it)


class IndexEntry(NamedTuple):
    """One index entry: its file name, and its summary unless it was written without one."""

    name: str
    summary: Summary | None


def index_dir(store: CheckpointStore) -> str:
    return store.loc.join(INDEX_DIR)


def unusable_index(store: CheckpointStore) -> str | None:
    """Why the run's ``.commits`` cannot be the index (a file, a link), None if it can."""
    kind = store.kind(index_dir(store))
    if kind in (None, DIRECTORY):
        return None
    what = "a symbolic link" if kind == LINK else "not a directory"
    return (f"{store.loc.url_of(index_dir(store))} is {what}; the index of committed steps must be a directory "
            "written by save_checkpoint")


def entry_path(store: CheckpointStore, name: str) -> str:
    return posixpath.join(index_dir(store), name)


def index_entries(store: CheckpointStore) -> dict[int, list[IndexEntry]]:
    """The run's index entries by step; names the library does not write are ignored."""
    listed = store.entries(index_dir(store))
    if not listed or unusable_index(store) is not None:
        return {}
    steps: dict[int, list[IndexEntry]] = {}
    for entry in listed:
        match = _ENTRY.fullmatch(entry.name)
        if not match or entry.kind != FILE or entry.name.split(".")[0] != f"step_{int(match.group(1)):08d}":
            continue
        world_size, size_bytes, micros, md5 = match.groups()[1:]
        summary = None if world_size is None else Summary(int(world_size), int(size_bytes), int(micros) / 1e6, md5)
        steps.setdefault(int(match.group(1)), []).append(IndexEntry(entry.name, summary))
    return steps


def _micros(seconds: float) -> int:
    return round(seconds * 1e6)


def indexed_size(store: CheckpointStore, step: int, entries: Iterable[IndexEntry], marker: dict[str, Any]) -> int | None:
    """The size of ``step``'s files as an entry of the commit ``marker`` says it; None if no
    entry is of that commit (a damaged or stale entry is ignored)."""
    for entry in entries:
        if entry.summary is not None:
            if entry.summary.world_size == marker["world_size"] and \
                    _micros(entry.summary.committed_at) == _micros(marker["committed_at"]):
                return entry.summary.size_bytes
            continue
        try:
            indexed = _read_entry(store, step, entry.name)
        except CheckpointError:
            continue
        if all(indexed.get(name) == marker.get(name) for name in ("world_size", "committed_at", "attempt")):
            return indexed["size_bytes"]
    return None


def entry_name(step_dir_name: str, summary: Summary) -> str:
    md5 = f".m{summary.marker_md5}" if summary.marker_md5 else ""
    return f"{step_dir_name}.w{summary.world_size}.b{summary.size_bytes}.t{_micros(summary.committed_at)}{md5}"


def marker_md5(data: bytes) -> str:
    """The MD5 of a marker's bytes, as S3 tags an object stored by one PUT."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def vouched(entries: Iterable[IndexEntry], tag: str | None) -> Summary | None:
    """The summary of the entry whose marker storage vouches for: the marker's tag (an S3
    ETag) is the MD5 the entry recorded of the bytes committed, so the marker is those
    bytes; None if no entry is vouched for (the marker is then read)."""
    return next((entry.summary for entry in entries if tag and entry.summary is not None
                 and entry.summary.marker_md5 == tag), None)


def write_entry(store: CheckpointStore, step: int, step_dir_name: str, marker: dict[str, Any], size_bytes: int,
                marker_bytes: bytes) -> None:
    """Index a step whose marker (``marker_bytes``) is stored (replacing entries a removed step left)."""
    problem = unusable_index(store)
    if problem is not None:
        raise CheckpointError(problem)
    store.ensure_directory(index_dir(store))
    remove_entries(store, index_entries(store).get(step, ()))
    name = entry_name(step_dir_name, Summary(marker["world_size"], size_bytes, marker["committed_at"],
                                             marker_md5(marker_bytes)))
    store.create_exclusive(entry_path(store, name), json.dumps({**marker, "size_bytes": size_bytes}).encode())


def remove_entries(store: CheckpointStore, entries: Iterable[IndexEntry]) -> None:
    for entry in entries:
        store.remove_file(entry_path(store, entry.name))


def _read_entry(store: CheckpointStore, step: int, name: str) -> dict[str, Any]:
    """The indexed marker of ``step`` (entry file ``name``) with ``size_bytes``, each field checked."""
    where = f"the index entry of step {step} at {store.loc.url}"
    entry = parse_marker(read_whole(store.loc, entry_path(store, name), where, MARKER_LIMIT), step, where)
    size = entry.get("size_bytes")
    if type(size) is not int or size < 0:
        raise CheckpointError(f"{where} is damaged: it has size_bytes {size!r}")
    return entry
