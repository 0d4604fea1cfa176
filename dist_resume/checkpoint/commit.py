"""Writing the commit layout (G7): a new directory for each save's files, the ``.committed``
marker that makes a step exist once every rank's files are stored, and pruning old steps.
Only rank 0 runs these; the collectives around them are the caller's.

A save's outcome is one fact, its marker (`save_outcome`): before the marker exists a failure
fails the save; once it exists the save succeeded, and what follows (indexing, pruning) only
warns if it fails.
"""

from __future__ import annotations

import json
import posixpath
import time
import uuid
from importlib import metadata as package_metadata

import torch

from dist_resume.checkpoint.commit_index import index_entries, remove_entries, write_entry
from dist_resume.checkpoint.digests import DIGESTS_KEY
from dist_resume.checkpoint.run_history import note_arrival, note_attempt, note_commit, step_taken
from dist_resume.checkpoint.save_outcome import unknown_outcome
from dist_resume.checkpoint.split_metadata import commit_digests
from dist_resume.checkpoint.step_dirs import (MARKER, read_commit, require_directory, step_dir, step_dir_name,
                                              step_directories)
from dist_resume.errors import CheckpointCorruptError, CheckpointError
from dist_resume.storage import CheckpointStore


def prepare_attempt(store: CheckpointStore, step: int) -> str:
    """Refuse a committed step, saying who committed it; return a new directory for this
    save's files, where no other save (another job on the same URL) writes. Nothing is
    deleted here."""
    store.require_container("save to")
    directory = step_dir(store, step)
    require_directory(store, directory, store.kind(directory))
    note_arrival(store)
    if store.exists(posixpath.join(directory, MARKER)):
        raise step_taken(store, step, "Nothing of this save was written")
    attempt = posixpath.join(directory, f"attempt_{uuid.uuid4().hex}")
    note_attempt(store.loc, attempt)
    return attempt


def marker_bytes(marker: dict) -> bytes:
    """A commit marker as stored."""
    return json.dumps(marker).encode()


def _version() -> str | None:
    try:
        return package_metadata.version("dist-resume")
    except package_metadata.PackageNotFoundError:
        return None


def commit(store: CheckpointStore, step: int, attempt: str, keep: int | None, world_size: int) -> list[str]:
    """Commit ``attempt`` as ``step`` if no other save committed it first (G7); return what
    failed after the commit ("it was not indexed: ..."), which leaves the step committed."""
    loc = store.loc
    where = f"step {step} at {loc.url}"
    try:
        digests = commit_digests(loc, attempt, where)  # every rank's shard is there, whole
    except CheckpointCorruptError as exc:
        raise CheckpointError(
            f"{where} not committed: rank 0 cannot read every rank's files ({exc}); the URL must "
            "name storage that every rank shares"
        ) from None
    marker = {
        "step": step,
        "attempt": posixpath.basename(attempt),
        "world_size": world_size,
        "committed_at": time.time_ns() // 1000 / 1e6,  # to the microsecond, as the index entry's name says it
        "torch": torch.__version__,
        "dist_resume": _version(),
        DIGESTS_KEY: digests,
    }
    if not _create_marker(store, step, marker):
        store.remove_tree(attempt)
        raise step_taken(store, step, "This save's files were removed")
    note_commit(loc, step)
    return _after_commit(store, step, marker, keep)


def _create_marker(store: CheckpointStore, step: int, marker: dict) -> bool:
    """Create ``step``'s marker unless it exists; True if this save created it. A creation
    whose answer is lost is settled by reading the marker back."""
    path = posixpath.join(step_dir(store, step), MARKER)
    try:
        return store.create_exclusive(path, marker_bytes(marker))
    except CheckpointError as failed:
        try:
            found = read_commit(store, step, step_dir(store, step))
        except CheckpointError as unread:
            raise unknown_outcome(f"step {step} at {store.loc.url}", "creating its commit marker failed", failed,
                                  unread) from None
        if found is None:
            raise
        return found.marker.get("attempt") == marker["attempt"]


def _after_commit(store: CheckpointStore, step: int, marker: dict, keep: int | None) -> list[str]:
    """Index the committed ``step`` and prune; return what failed of that (the step is
    committed whatever failed here; listings read the marker of a step that is not indexed)."""
    failed = []
    try:
        write_entry(store, step, step_dir_name(step), marker, store.tree_size(step_dir(store, step)),
                    marker_bytes(marker))
    except Exception as exc:  # noqa: BLE001 - said, never raised: the step is committed
        failed.append(f"it was not indexed: {exc} (listings read each step's commit marker instead)")
    if keep is not None:
        try:
            failed += prune(store, step, keep)
        except Exception as exc:  # noqa: BLE001
            failed.append(f"older steps were not pruned (keep={keep}): {exc}; the next save with keep= prunes them")
    return failed


def prune(store: CheckpointStore, step: int, keep: int) -> list[str]:
    """Delete committed steps older than ``step`` beyond the newest ``keep`` (``step`` included).
    Only steps whose markers say they are committed are counted or deleted: a step directory
    without a marker is not a step, and one with a damaged marker is left as it is (returned:
    what to say of them)."""
    steps = step_directories(store)
    entries = index_entries(store)
    kept, damaged = 1, []
    for old in sorted((s for s in steps if s < step), reverse=True):
        try:
            found = read_commit(store, old, steps[old])
        except CheckpointCorruptError:
            damaged.append(old)
            continue
        if found is None:
            continue
        if kept < keep:
            kept += 1
            continue
        # Unindex and uncommit first: a crash while deleting leaves an ignored directory.
        remove_entries(store, entries.get(old, ()))
        store.remove_file(posixpath.join(steps[old], MARKER))
        store.remove_tree(steps[old])
    if not damaged:
        return []
    return [f"keep={keep} left steps {damaged} alone: their commit markers are damaged (load_checkpoint with "
            "step= says how)"]
