"""The run's index of committed steps: ``<url>/.commits/step_00000100`` repeats step 100's
commit marker with the size of its files, so that finding the latest step is one listing
of the run and one of the index (pages, not a request per step), and ``list_checkpoints``
reads no step's tree.

The marker in the step directory stays what commits a step (G7). An index entry is
written after it and removed before it, so an entry whose step directory is listed always
has its marker; a committed step without an entry (a run saved before the index existed,
or a crash between the two writes) is found by checking its marker, as before.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from dist_resume.checkpoint.bounded_files import read_whole
from dist_resume.checkpoint.marker import MARKER_LIMIT, parse_marker
from dist_resume.errors import CheckpointCorruptError, CheckpointError
from dist_resume.storage import DIRECTORY, FILE, LINK, CheckpointStore

INDEX_DIR = ".commits"
_ENTRY = re.compile(r"step_(\d{8,})")
_UNFINISHED = re.compile(r"step_\d{8,}\.[0-9a-f]{32}\.tmp")  # a local writer's private name, left by a crash


def index_dir(store: CheckpointStore) -> str:
    return store.loc.join(INDEX_DIR)


def _require_directory(store: CheckpointStore) -> None:
    # A link would lead the index's reads and writes outside the run.
    kind = store.kind(index_dir(store))
    if kind not in (None, DIRECTORY):
        what = "a symbolic link" if kind == LINK else "not a directory"
        raise CheckpointError(f"{store.loc.url_of(index_dir(store))} is {what}; the index of committed "
                              "steps must be a directory written by save_checkpoint")


def entry_path(store: CheckpointStore, step_dir_name: str) -> str:
    return posixpath.join(index_dir(store), step_dir_name)


def indexed_steps(store: CheckpointStore) -> set[int]:
    """Steps the index names; a name the library did not write is refused, not skipped."""
    entries = store.entries(index_dir(store))
    if entries:
        _require_directory(store)
    steps = set()
    for entry in entries:
        if _UNFINISHED.fullmatch(entry.name):
            continue
        match = _ENTRY.fullmatch(entry.name)
        if not match or entry.kind != FILE or entry.name != f"step_{int(match.group(1)):08d}":
            raise CheckpointError(
                f"{store.loc.url_of(index_dir(store))} holds {entry.name}, which dist-resume did not write "
                "(its index of committed steps holds only step_NNNNNNNN files); remove it"
            )
        steps.add(int(match.group(1)))
    return steps


def write_entry(store: CheckpointStore, step_dir_name: str, marker: dict[str, Any], size_bytes: int) -> None:
    """Index a step whose marker is stored (replacing an entry a removed step left)."""
    data = json.dumps({**marker, "size_bytes": size_bytes}).encode()
    path = entry_path(store, step_dir_name)
    _require_directory(store)
    store.ensure_directory(index_dir(store))
    store.remove_file(path)
    store.create_exclusive(path, data)


def read_entry(store: CheckpointStore, step: int, step_dir_name: str) -> dict[str, Any]:
    """The indexed marker of ``step`` with ``size_bytes``, each field checked."""
    where = f"step {step} at {store.loc.url}"
    data = read_whole(store.loc, entry_path(store, step_dir_name), where, MARKER_LIMIT)
    entry = parse_marker(data, step, f"the index entry of {where}")
    size = entry.get("size_bytes")
    if type(size) is not int or size < 0:
        raise CheckpointCorruptError(f"the index entry of {where} is damaged: it has size_bytes {size!r}")
    return entry
