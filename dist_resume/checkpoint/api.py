"""Atomic, sharded, elastic DCP checkpoints at any fsspec URL (G6-G9).

Each save writes DCP's files into a directory of its own; once every rank's files are
stored, rank 0 commits the step by creating its ``.committed`` marker if no other save did
(see checkpoint_layout). Only committed steps exist for loading and listing; "latest" is
the newest committed step.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata as package_metadata
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.stateful import Stateful

from dist_resume.arguments import checked_flag, checked_int, checked_url
from dist_resume.checkpoint_collectives import checkpoint_group, dcp_call, distributed, on_rank0
from dist_resume.checkpoint_layout import (
    MARKER,
    committed_steps,
    read_commit,
    refuse_misplaced,
    step_dir,
)
from dist_resume.checkpoint_read import BoundedReader, read_metadata
from dist_resume.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
)
from dist_resume.nested import set_path
from dist_resume.rank_agreement import require_same_location
from dist_resume.safe_load import SafeLoadPlanner
from dist_resume.state import ELASTIC_GUARD_KEY
from dist_resume.storage import CheckpointStore, CheckpointWriter, open_store, resolve

T = TypeVar("T")



@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as ``list_checkpoints`` reports it."""

    step: int
    committed_at: float  # seconds since the epoch
    world_size: int
    size_bytes: int
    url: str  # printable: credentials removed


# ---------------------------------------------------------------- committing

def _prepare(store: CheckpointStore, step: int) -> str:
    """Refuse a committed step; return a new directory for this save's files, where no
    other save (another job on the same URL) writes. Nothing is deleted here."""
    store.require_container("save to")
    if store.exists(posixpath.join(step_dir(store, step), MARKER)):
        raise CheckpointExistsError(
            f"step {step} is already committed at {store.loc.url}; a committed checkpoint is never overwritten"
        )
    return posixpath.join(step_dir(store, step), f"attempt_{uuid.uuid4().hex}")


def _version() -> str | None:
    try:
        return package_metadata.version("dist-resume")
    except package_metadata.PackageNotFoundError:
        return None


def _commit(store: CheckpointStore, step: int, attempt: str, keep: int | None, world_size: int) -> None:
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
        "committed_at": time.time(),
        "torch": torch.__version__,
        "dist_resume": _version(),
    }
    if not store.create_exclusive(posixpath.join(step_dir(store, step), MARKER), json.dumps(marker).encode()):
        store.remove_tree(attempt)
        raise CheckpointExistsError(
            f"{where} was committed by another save while this one ran (two jobs on one URL?); "
            "this save's files were removed and the committed step is unchanged"
        )
    if keep is not None:
        _prune(store, step, keep)


def _prune(store: CheckpointStore, step: int, keep: int) -> None:
    """Delete committed steps older than ``step`` beyond the newest ``keep`` (``step`` included)."""
    steps = committed_steps(store)
    older = sorted(s for s in steps if s < step)
    for old in older[: max(0, len(older) - (keep - 1))]:
        # Uncommit first: a crash while deleting leaves an ignored directory.
        store.remove_file(posixpath.join(steps[old], MARKER))
        store.remove_tree(steps[old])


# ---------------------------------------------------------------- saving

class SaveHandle:
    """An asynchronous save; its step is committed once ``result()`` returns."""

    def __init__(self, step: int, future: Future) -> None:
        self.step = step
        self._future = future
        self._observed = False

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> int:
        """Wait for the commit; return the step, or raise why it was not committed."""
        self._observed = True
        return self._future.result(timeout)

    def wait(self, timeout: float | None = None) -> None:
        self.result(timeout)


_in_flight: SaveHandle | None = None
_in_flight_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _wait_for_previous_save() -> None:
    """At most one save in flight: wait for it; report its failure if nobody looked at it."""
    global _in_flight
    with _in_flight_lock:
        previous, _in_flight = _in_flight, None
    if previous is None:
        return
    observed = previous._observed
    try:
        previous.result()
    except CheckpointError as exc:
        if not observed:
            raise CheckpointError(f"the asynchronous save of step {previous.step} failed: {exc}") from None


def _finish(store: CheckpointStore, step: int, attempt: str, keep: int | None,
            group: dist.ProcessGroup | None) -> None:
    world_size = dist.get_world_size(group) if distributed() else 1
    if distributed():
        dist.barrier(group=group)  # every rank's data is stored
    on_rank0(group, lambda: _commit(store, step, attempt, keep, world_size))


def _finish_async(upload: Future, store: CheckpointStore, step: int, attempt: str, keep: int | None,
                  group: dist.ProcessGroup | None, where: str) -> int:
    dcp_call(store.loc, "saving", where, upload.result)
    _finish(store, step, attempt, keep, group)
    return step


def save_checkpoint(
    state: dict[str, Any],
    url: str,
    step: int,
    *,
    keep: int | None = None,
    async_save: bool = False,
    storage_options: dict[str, Any] | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> SaveHandle | None:
    """Save ``state`` (a DCP state dict; Stateful entries welcome) as ``step`` under ``url``.

    Collective: every rank of ``process_group`` calls it. The step is written to a new
    directory and committed only after every rank's data and DCP's ``.metadata`` are
    stored; a crash at any point leaves the previous committed step loadable (G7). A
    committed step is never overwritten (:class:`CheckpointExistsError`). With ``keep=K``,
    older committed steps beyond the newest K are deleted after the commit.

    With ``async_save=True`` the state is copied to memory, written in the background over
    a gloo group of its own, and a :class:`SaveHandle` is returned; a new save first waits
    for the previous one.
    """
    global _in_flight, _executor
    step = checked_int("step", step, 0)
    keep = None if keep is None else checked_int("keep", keep, 1)
    async_save = checked_flag("async_save", async_save)
    loc = resolve(checked_url(url), storage_options)
    store = open_store(loc)
    _wait_for_previous_save()
    group = checkpoint_group(process_group) if async_save else process_group
    require_same_location(loc, group, f"save step {step}")
    where = f"step {step} at {loc.url}"
    attempt = on_rank0(group, lambda: _prepare(store, step))
    writer = CheckpointWriter(loc, attempt)
    if not async_save:
        dcp_call(loc, "saving", where, dcp.save, state, storage_writer=writer, process_group=group)
        _finish(store, step, attempt, keep, group)
        return None
    upload = dcp_call(loc, "saving", where, dcp.async_save, state, storage_writer=writer,
                       process_group=group)
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dist_resume_commit")
    handle = SaveHandle(step, _executor.submit(_finish_async, upload, store, step, attempt, keep, group, where))
    with _in_flight_lock:
        _in_flight = handle
    return handle


# ---------------------------------------------------------------- loading

def _choose(store: CheckpointStore, step: int | None) -> tuple[int, str, Metadata] | None:
    """The committed ``step`` (default: the latest), its data directory and its metadata;
    None if the location holds nothing."""
    steps = committed_steps(store)
    if not steps:
        refuse_misplaced(store)
    if step is None:
        if not steps:
            return None
        step = max(steps)
    elif step not in steps:
        committed = ", ".join(map(str, sorted(steps))) or "none"
        raise CheckpointNotFoundError(
            f"step {step} is not committed at {store.loc.url} (committed steps: {committed})"
        )
    _, directory = read_commit(store, step, steps[step])
    return step, directory, read_metadata(store.loc, directory, f"step {step} at {store.loc.url}")


def _placeholder(entry: Any) -> torch.Tensor | None:
    if isinstance(entry, TensorStorageMetadata):
        return torch.zeros(entry.size, dtype=entry.properties.dtype)
    return None  # a stored value: the safe planner replaces it


def _load_targets(state: dict[str, Any], metadata: Metadata) -> tuple[dict[str, Any], set[str]]:
    """What DCP loads into: ``state``, except that entries saved with the elastic guard get
    a template of everything saved under them (all saved ranks), built from the metadata."""
    saved = metadata.state_dict_metadata
    targets: dict[str, Any] = {}
    elastic = set()
    for key, value in state.items():
        if f"{key}.{ELASTIC_GUARD_KEY}" not in saved:
            targets[key] = value
            continue
        template: dict[str, Any] = {}
        for fqn, entry in saved.items():
            path = metadata.planner_data[fqn]
            if path[0] == key:
                set_path(template, path, _placeholder(entry))
        targets[key] = template[key]
        elastic.add(key)
    return targets, elastic


def load_checkpoint(
    state: dict[str, Any],
    url: str,
    step: int | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> int | None:
    """Load committed ``step`` (default: the latest) from ``url`` into ``state``; return it.

    Collective. Returns None when ``url`` holds no committed step (first start), so a
    training script can call it unconditionally; an explicit ``step`` that is not committed
    raises :class:`CheckpointNotFoundError`. Entries whose saved state carries the elastic
    guard (the data loader) receive every saved rank's entries, whatever the world size
    then and now. Nothing in the checkpoint is executed (G8): ``.metadata`` admits only
    DCP's types, stored values only plain data.
    """
    step = None if step is None else checked_int("step", step, 0)
    loc = resolve(checked_url(url), storage_options)
    _wait_for_previous_save()
    require_same_location(loc, process_group, "load a checkpoint")
    chosen = on_rank0(process_group, lambda: _choose(open_store(loc), step))
    if chosen is None:
        return None
    step, directory, metadata = chosen
    where = f"step {step} at {loc.url}"
    targets, elastic = _load_targets(state, metadata)
    reader = BoundedReader(loc, directory, metadata, where)
    dcp_call(loc, "loading", where, dcp.load, targets, storage_reader=reader,
              planner=SafeLoadPlanner(where), process_group=process_group)
    for key, value in state.items():
        if key in elastic and isinstance(value, Stateful):
            value.load_state_dict(targets[key])
        elif not isinstance(value, Stateful):
            state[key] = targets[key]
    return step


def read_loader_states(
    url: str,
    step: int | None = None,
    *,
    key: str = "loader",
    storage_options: dict[str, Any] | None = None,
) -> tuple[int, dict[str, Any]]:
    """The loader state saved under ``key`` at committed ``step`` (default: the latest), with
    every saved rank's entries merged; read in this process alone, no process group needed.
    Returns ``(step, state)``; the state feeds ``dist_resume.state.decode`` or ``plan_resume``.
    Loads plain data only (G8)."""
    step = None if step is None else checked_int("step", step, 0)
    loc = resolve(checked_url(url), storage_options)
    chosen = _choose(open_store(loc), step)
    if chosen is None:
        raise CheckpointNotFoundError(f"no committed checkpoint at {loc.url}")
    step, directory, metadata = chosen
    where = f"step {step} at {loc.url}"
    if f"{key}.{ELASTIC_GUARD_KEY}" not in metadata.state_dict_metadata:
        raise CheckpointError(f"{where} holds no data loader state under {key!r}")
    targets, _ = _load_targets({key: None}, metadata)
    reader = BoundedReader(loc, directory, metadata, where)
    dcp_call(loc, "loading", where, dcp.load, targets, storage_reader=reader,
              planner=SafeLoadPlanner(where), no_dist=True)
    return step, targets[key]


def list_checkpoints(url: str, storage_options: dict[str, Any] | None = None) -> list[CheckpointInfo]:
    """Committed checkpoints under ``url``, oldest first; uncommitted directories are ignored,
    a location that holds something else than checkpoints is refused (as by load_checkpoint)."""
    store = open_store(resolve(checked_url(url), storage_options))
    steps = committed_steps(store)
    if not steps:
        refuse_misplaced(store)
    infos = []
    for step, directory in sorted(steps.items()):
        marker, _ = read_commit(store, step, directory)
        infos.append(CheckpointInfo(step=step, committed_at=marker["committed_at"],
                                    world_size=marker["world_size"], size_bytes=store.tree_size(directory),
                                    url=store.loc.url_of(directory)))
    return infos
