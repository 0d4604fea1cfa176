"""The run's index of committed steps: ``<url>/.commits/step_00000100.w4.b8346.t1764261437123456``
repeats step 100's commit marker with the size of its files, and its name says what
``list_checkpoints`` reports (world size 4, 8,346 bytes, committed at that microsecond), so
that finding the latest step and listing the run are one listing of the run and one of the
index (pages, not a request per step). Entries named ``step_00000100`` alone (written before
names said more) are read as before, one request each.

The marker in the step directory stays what commits a step (G7). An index entry is
written after it and removed before it, so an entry whose step directory is listed always
has its marker; a committed step without an entry (a run saved before the index existed,
or a crash between the two writes) is found by checking its marker, as before.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any, NamedTuple

from dist_resume.checkpoint.bounded_files import read_whole
from dist_resume.checkpoint.marker import LATEST_TIME, MARKER_LIMIT, parse_marker
from dist_resume.errors import CheckpointCorruptError, CheckpointError
from dist_resume.state.fields import MAX_WORLD_SIZE
from dist_resume.storage import DIRECTORY, FILE, LINK, CheckpointStore

INDEX_DIR = ".commits"
# Bounded digit counts: a name never stands for a number too large to convert.
_SUMMARY = r"\.w(\d{1,7})\.b(\d{1,19})\.t(\d{1,17})"
_ENTRY = re.compile(rf"step_(\d{{8,}})(?:{_SUMMARY})?")
_UNFINISHED = re.compile(rf"step_\d{{8,}}(?:{_SUMMARY})?\.[0-9a-f]{{32}}\.tmp")  # a local writer's private name, left by a crash


class Summary(NamedTuple):
    """What an index entry's name says of its step."""

    world_size: int
    size_bytes: int
    committed_at: float  # seconds since the epoch, to the microsecond


class IndexEntry(NamedTuple):
    """One index entry: its file name, and its summary unless it was written without one."""

    name: str
    summary: Summary | None


def index_dir(store: CheckpointStore) -> str:
    return store.loc.join(INDEX_DIR)


def _require_directory(store: CheckpointStore) -> None:
    # A link would lead the index's reads and writes outside the run.
    kind = store.kind(index_dir(store))
    if kind not in (None, DIRECTORY):
        what = "a symbolic link" if kind == LINK else "not a directory"
        raise CheckpointError(f"{store.loc.url_of(index_dir(store))} is {what}; the index of committed "
                              "steps must be a directory written by save_checkpoint")


def entry_path(store: CheckpointStore, name: str) -> str:
    return posixpath.join(index_dir(store), name)


def indexed_steps(store: CheckpointStore) -> dict[int, IndexEntry]:
    """Steps the index names, with their entries; a name the library did not write is
    refused, not skipped, and so is a second entry of one step."""
    entries = store.entries(index_dir(store))
    if entries:
        _require_directory(store)
    steps: dict[int, IndexEntry] = {}
    for entry in entries:
        if _UNFINISHED.fullmatch(entry.name):
            continue
        match = _ENTRY.fullmatch(entry.name)
        if not match or entry.kind != FILE or entry.name.split(".")[0] != f"step_{int(match.group(1)):08d}":
            raise CheckpointError(
                f"{store.loc.url_of(index_dir(store))} holds {entry.name}, which dist-resume did not write "
                "(its index of committed steps holds only step_NNNNNNNN files); remove it"
            )
        step = int(match.group(1))
        if step in steps:
            raise CheckpointError(f"{store.loc.url_of(index_dir(store))} holds two entries of step {step} "
                                  f"({steps[step].name}, {entry.name}); remove the one dist-resume did not write")
        world_size, size_bytes, micros = match.groups()[1:]
        summary = None if world_size is None else Summary(int(world_size), int(size_bytes), int(micros) / 1e6)
        steps[step] = IndexEntry(entry.name, summary)
    return steps


def checked_summary(store: CheckpointStore, step: int, summary: Summary) -> Summary:
    """``summary`` of ``step``'s entry, refused if it cannot be true (loading reads the step's
    own marker instead, so only listing needs this)."""
    if not 1 <= summary.world_size <= MAX_WORLD_SIZE or summary.committed_at > LATEST_TIME:
        raise CheckpointCorruptError(f"the index entry of step {step} at {store.loc.url} is damaged: its name "
                                     f"says world_size {summary.world_size}, committed_at {summary.committed_at}")
    return summary


def entry_name(step_dir_name: str, summary: Summary) -> str:
    micros = round(summary.committed_at * 1e6)
    return f"{step_dir_name}.w{summary.world_size}.b{summary.size_bytes}.t{micros}"


def write_entry(store: CheckpointStore, step: int, step_dir_name: str, marker: dict[str, Any], size_bytes: int) -> None:
    """Index a step whose marker is stored (replacing an entry a removed step left)."""
    data = json.dumps({**marker, "size_bytes": size_bytes}).encode()
    _require_directory(store)
    store.ensure_directory(index_dir(store))
    stale = indexed_steps(store).get(step)
    if stale is not None:
        store.remove_file(entry_path(store, stale.name))
    name = entry_name(step_dir_name, Summary(marker["world_size"], size_bytes, marker["committed_at"]))
    store.create_exclusive(entry_path(store, name), data)


def read_entry(store: CheckpointStore, step: int, name: str) -> dict[str, Any]:
    """The indexed marker of ``step`` (entry file ``name``) with ``size_bytes``, each field checked."""
    where = f"step {step} at {store.loc.url}"
    data = read_whole(store.loc, entry_path(store, name), where, MARKER_LIMIT)
    entry = parse_marker(data, step, f"the index entry of {where}")
    size = entry.get("size_bytes")
    if type(size) is not int or size < 0:
        raise CheckpointCorruptError(f"the index entry of {where} is damaged: it has size_bytes {size!r}")
    return entry
