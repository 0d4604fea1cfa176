"""Writing the commit layout (G7): a new directory for each save's files, the ``.committed``
marker that makes a step exist once every rank's files are stored, and pruning old steps.
Only rank 0 runs these; the collectives around them are the caller's."""

from __future__ import annotations

import json
import posixpath
import time
import uuid
from importlib import metadata as package_metadata

import torch

from dist_resume.checkpoint.commit_index import entry_path, write_entry
from dist_resume.checkpoint.metadata_checks import read_metadata
from dist_resume.checkpoint.run_history import note_arrival, note_attempt, note_commit, step_taken
from dist_resume.checkpoint.step_dirs import MARKER, indexed_committed_steps, require_directory, step_dir, step_dir_name
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
        read_metadata(loc, attempt, where)  # every rank's shard is there, whole
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
    }
    if not store.create_exclusive(posixpath.join(step_dir(store, step), MARKER), json.dumps(marker).encode()):
        store.remove_tree(attempt)
        raise step_taken(store, step, "This save's files were removed")
    note_commit(loc, step)
    # The step is committed from here on: a failure says so, never "cannot save".
    try:
        write_entry(store, step, step_dir_name(step), marker, store.tree_size(step_dir(store, step)))
    except CheckpointError as exc:
        raise type(exc)(f"{where} is committed, but indexing it failed (loads find it by its marker): {exc}") from None
    if keep is not None:
        try:
            prune(store, step, keep)
        except CheckpointError as exc:
            raise type(exc)(f"{where} is committed, but deleting the steps beyond keep={keep} failed: {exc}") from None


def prune(store: CheckpointStore, step: int, keep: int) -> None:
    """Delete committed steps older than ``step`` beyond the newest ``keep`` (``step`` included)."""
    steps, indexed = indexed_committed_steps(store)
    older = sorted(s for s in steps if s < step)
    for old in older[: max(0, len(older) - (keep - 1))]:
        # Unindex and uncommit first: a crash while deleting leaves an ignored directory.
        if old in indexed:
            store.remove_file(entry_path(store, indexed[old].name))
        store.remove_file(posixpath.join(steps[old], MARKER))
        store.remove_tree(steps[old])
