"""Writing the commit layout (G7): a new directory for each save's files, the ``.committed``
marker that makes a step exist once every rank's files are stored, and pruning old steps.
Only rank 0 runs these; the collectives around them are the caller's.

A save's outcome is one fact, its marker: before the marker exists a failure fails the save;
once it exists the save succeeded, and what follows (indexing, pruning) only warns if it fails.
"""

from __future__ import annotations

import json
import posixpath
import time
import uuid
import warnings
from importlib import metadata as package_metadata

import torch

from dist_resume.checkpoint.commit_index import index_entries, remove_entries, write_entry
from dist_resume.checkpoint.digests import DIGESTS_KEY
from dist_resume.checkpoint.split_metadata import commit_digests
from dist_resume.checkpoint.step_dirs import (MARKER, read_commit, require_directory, step_dir, step_dir_name,
                                              step_directories)
from dist_resume.errors import CheckpointCorruptError, CheckpointError, CheckpointExistsError
from dist_resume.storage import CheckpointStore


def prepare_attempt(store: CheckpointStore, step: int) -> str:
    """Refuse a committed step; return a new directory for this save's files, where no
    other save (another job on the same URL) writes. Nothing is deleted here."""
    store.require_container("save to")
    directory = step_dir(store, step)
    require_directory(store, directory, store.kind(directory))
    if store.exists(posixpath.join(directory, MARKER)):
        raise CheckpointExistsError(
            f"step {step} is already committed at {store.loc.url}; a committed checkpoint is never overwritten"
        )
    return posixpath.join(directory, f"attempt_{uuid.uuid4().hex}")


class OutcomeUnknown(CheckpointError):
    """A save that cannot tell whether its step is committed (storage stopped answering as
    its marker was created); the message says so."""


def unknown_outcome(where: str, what_failed: str, failure: BaseException, unread: CheckpointError) -> OutcomeUnknown:
    """The error of a save that failed as ``what_failed`` said (with ``failure``) and could not
    read its commit marker then (``unread``)."""
    if isinstance(failure, OutcomeUnknown):
        return failure
    return OutcomeUnknown(f"whether {where} is committed is not known: {what_failed} ({failure}) and reading its "
                          f"commit marker failed too ({unread}); list_checkpoints tells once storage answers")


def marker_bytes(marker: dict) -> bytes:
    """A commit marker as stored."""
    return json.dumps(marker).encode()


def _version() -> str | None:
    try:
        return package_metadata.version("dist-resume")
    except package_metadata.PackageNotFoundError:
        return None


def commit(store: CheckpointStore, step: int, attempt: str, keep: int | None, world_size: int) -> None:
    """Commit ``attempt`` as ``step`` if no other save committed it first (G7)."""
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
        raise CheckpointExistsError(
            f"{where} was committed by another save while this one ran (two jobs on one URL?); "
            "this save's files were removed and the committed step is unchanged"
        )
    _after_commit(store, step, marker, keep)


def committed_by(store: CheckpointStore, step: int, attempt: str) -> bool:
    """Whether ``step`` is committed, and by the save whose files are in ``attempt``."""
    found = read_commit(store, step, step_dir(store, step))
    return found is not None and found.marker.get("attempt") == posixpath.basename(attempt)


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


def _after_commit(store: CheckpointStore, step: int, marker: dict, keep: int | None) -> None:
    """Index the committed ``step`` and prune: a failure of either leaves the save committed,
    and says so (listings read the marker of a step that is not indexed)."""
    try:
        write_entry(store, step, step_dir_name(step), marker, store.tree_size(step_dir(store, step)),
                    marker_bytes(marker))
    except Exception as exc:  # noqa: BLE001 - the step is committed whatever failed here
        warnings.warn(f"step {step} at {store.loc.url} is committed, but it was not indexed: {exc} (listings "
                      "read each step's commit marker instead)", stacklevel=2)
    if keep is None:
        return
    try:
        prune(store, step, keep)
    except Exception as exc:  # noqa: BLE001
        warnings.warn(f"step {step} at {store.loc.url} is committed, but older steps were not pruned "
                      f"(keep={keep}): {exc}; the next save with keep= prunes them", stacklevel=2)


def prune(store: CheckpointStore, step: int, keep: int) -> None:
    """Delete committed steps older than ``step`` beyond the newest ``keep`` (``step`` included).
    Only steps whose markers say they are committed are counted or deleted: a step directory
    without a marker is not a step, and one with a damaged marker is left as it is."""
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
    if damaged:
        warnings.warn(f"keep={keep} at {store.loc.url} left steps {damaged} alone: their commit markers are "
                      "damaged (load_checkpoint with step= says how)", stacklevel=2)
