"""Atomic, sharded, elastic DCP checkpoints at any fsspec URL (G6-G9).

Layout: ``<url>/step_00000100/`` holds DCP's files and, once the save is complete on every
rank, a ``.committed`` marker (JSON) written by rank 0. Only committed steps exist for
loading and listing; "latest" is the newest committed step.
"""

from __future__ import annotations

import json
import posixpath
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata as package_metadata
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.stateful import Stateful

from dist_resume.checkpoint_read import BoundedReader, read_marker, read_metadata
from dist_resume.errors import (
    CheckpointError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    StorageError,
)
from dist_resume.nested import set_path
from dist_resume.safe_load import SafeLoadPlanner
from dist_resume.state import ELASTIC_GUARD_KEY
from dist_resume.storage import CheckpointWriter, Location, resolve, retry, write_atomic

T = TypeVar("T")

MARKER = ".committed"
_METADATA = ".metadata"
_STEP_DIR = re.compile(r"step_(\d+)")


def step_dir_name(step: int) -> str:
    """Directory name of ``step``; zero-padded so that names sort like steps."""
    return f"step_{step:08d}"


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as ``list_checkpoints`` reports it."""

    step: int
    committed_at: float  # seconds since the epoch
    world_size: int
    size_bytes: int
    url: str  # printable: credentials removed


# ---------------------------------------------------------------- collectives

def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _on_rank0(group: dist.ProcessGroup | None, fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 of ``group`` and hand its result, or its error, to every rank."""
    if not _distributed() or dist.get_world_size(group) == 1:
        return fn()
    payload: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank(group) == 0:
        try:
            payload[0] = (True, fn())
        except CheckpointError as exc:
            payload[0] = (False, exc)
        except BaseException as exc:  # other ranks must not wait forever: tell them, raise here
            failure = exc
            payload[0] = (False, CheckpointError(f"rank 0 failed: {type(exc).__name__}: {exc}"))
    dist.broadcast_object_list(payload, group=group, group_src=0)
    if failure is not None:
        raise failure
    ok, value = payload[0]
    if not ok:
        raise value
    return value


_GLOO_GROUPS: dict[tuple[int, ...], dist.ProcessGroup] = {}


def _checkpoint_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """A gloo group of ``group``'s ranks used only by background saves, created once, so that
    their collectives never interleave with the training's on the same group."""
    if not _distributed():
        return None
    ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
    if ranks not in _GLOO_GROUPS:
        _GLOO_GROUPS[ranks] = dist.new_group(ranks=list(ranks), backend="gloo")
    return _GLOO_GROUPS[ranks]


def _dcp_call(loc: Location, action: str, where: str, fn: Callable[..., T], *args: Any,
              **kwargs: Any) -> T:
    """Call a DCP function; turn its CheckpointException (a BaseException) into an error
    that says what failed, preferring a dist_resume error raised on some rank."""
    try:
        return fn(*args, **kwargs)
    except CheckpointException as exc:
        failures = sorted(exc.failures.items())
        for _, (error, _trace) in failures:
            if isinstance(error, CheckpointError):
                raise error from None
        _, (first, _trace) = failures[0]
        raise CheckpointError(
            f"{action} {where} failed on rank(s) {[rank for rank, _ in failures]}: "
            f"{type(first).__name__}: {loc.redact(str(first))}"
        ) from None


# ---------------------------------------------------------------- layout on storage

def _committed_steps(loc: Location) -> dict[int, str]:
    """Committed steps at ``loc`` and their directories."""
    loc.fs.invalidate_cache()  # other processes commit: never trust a cached listing
    try:
        markers = retry(loc.fs.glob, loc.join("step_*", MARKER))
    except FileNotFoundError:
        markers = []  # nothing saved yet (_choose tells a missing bucket apart)
    except Exception as exc:
        raise loc.error("list checkpoints at", loc.root, exc) from None
    steps = {}
    for marker in markers:
        directory = posixpath.dirname(marker)
        match = _STEP_DIR.fullmatch(posixpath.basename(directory))
        if match:
            steps[int(match.group(1))] = directory
    return steps


def _check_container(loc: Location) -> None:
    """On object stores, a missing bucket is an error, not "no checkpoint yet"."""
    if loc.is_local or loc.fs.root_marker:
        return
    bucket = loc.root.split("/", 1)[0]
    try:
        exists = retry(loc.fs.exists, bucket)
    except Exception as exc:
        raise loc.error("list checkpoints at", loc.root, exc) from None
    if not exists:
        raise StorageError(f"cannot read checkpoints at {loc.url}: bucket '{bucket}' does not exist")


def _prepare(loc: Location, step: int) -> None:
    """Refuse a committed step; clear the leftovers of an uncommitted save of it."""
    directory = loc.join(step_dir_name(step))
    loc.fs.invalidate_cache()
    try:
        committed = retry(loc.fs.exists, posixpath.join(directory, MARKER))
        if not committed and retry(loc.fs.exists, directory):
            retry(loc.fs.rm, directory, recursive=True)
    except Exception as exc:
        raise loc.error("prepare", directory, exc) from None
    if committed:
        raise CheckpointExistsError(
            f"step {step} is already committed at {loc.url}; a committed checkpoint is never overwritten"
        )


def _version() -> str | None:
    try:
        return package_metadata.version("dist-resume")
    except package_metadata.PackageNotFoundError:
        return None


def _commit(loc: Location, step: int, keep: int | None, world_size: int) -> None:
    directory = loc.join(step_dir_name(step))
    marker = {
        "step": step,
        "world_size": world_size,
        "committed_at": time.time(),
        "torch": torch.__version__,
        "dist_resume": _version(),
    }
    try:
        if not retry(loc.fs.exists, posixpath.join(directory, _METADATA)):
            raise CheckpointError(f"step {step} at {loc.url} not committed: DCP wrote no {_METADATA}")
        write_atomic(loc, posixpath.join(directory, MARKER), json.dumps(marker).encode())
    except CheckpointError:
        raise
    except Exception as exc:
        raise loc.error("commit", directory, exc) from None
    if keep is not None:
        _prune(loc, step, keep)


def _prune(loc: Location, step: int, keep: int) -> None:
    """Delete committed steps older than ``step`` beyond the newest ``keep`` (``step`` included)."""
    steps = _committed_steps(loc)
    older = sorted(s for s in steps if s < step)
    for old in older[: max(0, len(older) - (keep - 1))]:
        try:
            # Uncommit first: a crash while deleting leaves an ignored directory.
            retry(loc.fs.rm, posixpath.join(steps[old], MARKER))
            retry(loc.fs.rm, steps[old], recursive=True)
        except Exception as exc:
            raise loc.error(f"delete old step {old} (step {step} is committed) at", steps[old], exc) from None


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


def _finish(loc: Location, step: int, keep: int | None, group: dist.ProcessGroup | None) -> None:
    world_size = dist.get_world_size(group) if _distributed() else 1
    if _distributed():
        dist.barrier(group=group)  # every rank's data is stored
    _on_rank0(group, lambda: _commit(loc, step, keep, world_size))


def _finish_async(upload: Future, loc: Location, step: int, keep: int | None,
                  group: dist.ProcessGroup | None, where: str) -> int:
    _dcp_call(loc, "saving", where, upload.result)
    _finish(loc, step, keep, group)
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
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    if keep is not None and (not isinstance(keep, int) or keep < 1):
        raise ValueError(f"keep must be a positive int or None, got {keep!r}")
    loc = resolve(url, storage_options)
    _wait_for_previous_save()
    group = _checkpoint_group(process_group) if async_save else process_group
    where = f"step {step} at {loc.url}"
    _on_rank0(group, lambda: _prepare(loc, step))
    writer = CheckpointWriter(loc, loc.join(step_dir_name(step)))
    if not async_save:
        _dcp_call(loc, "saving", where, dcp.save, state, storage_writer=writer, process_group=group)
        _finish(loc, step, keep, group)
        return None
    upload = _dcp_call(loc, "saving", where, dcp.async_save, state, storage_writer=writer,
                       process_group=group)
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dist_resume_commit")
    handle = SaveHandle(step, _executor.submit(_finish_async, upload, loc, step, keep, group, where))
    with _in_flight_lock:
        _in_flight = handle
    return handle


# ---------------------------------------------------------------- loading

def _choose(loc: Location, step: int | None) -> tuple[int, Metadata] | None:
    steps = _committed_steps(loc)
    if not steps:
        _check_container(loc)
    if step is None:
        if not steps:
            return None
        step = max(steps)
    elif step not in steps:
        committed = ", ".join(map(str, sorted(steps))) or "none"
        raise CheckpointNotFoundError(
            f"step {step} is not committed at {loc.url} (committed steps: {committed})"
        )
    where = f"step {step} at {loc.url}"
    return step, read_metadata(loc, steps[step], where)


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
    loc = resolve(url, storage_options)
    _wait_for_previous_save()
    chosen = _on_rank0(process_group, lambda: _choose(loc, step))
    if chosen is None:
        return None
    step, metadata = chosen
    where = f"step {step} at {loc.url}"
    targets, elastic = _load_targets(state, metadata)
    reader = BoundedReader(loc, loc.join(step_dir_name(step)), metadata, where)
    _dcp_call(loc, "loading", where, dcp.load, targets, storage_reader=reader,
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
    loc = resolve(url, storage_options)
    chosen = _choose(loc, step)
    if chosen is None:
        raise CheckpointNotFoundError(f"no committed checkpoint at {loc.url}")
    step, metadata = chosen
    where = f"step {step} at {loc.url}"
    if f"{key}.{ELASTIC_GUARD_KEY}" not in metadata.state_dict_metadata:
        raise CheckpointError(f"{where} holds no data loader state under {key!r}")
    targets, _ = _load_targets({key: None}, metadata)
    reader = BoundedReader(loc, loc.join(step_dir_name(step)), metadata, where)
    _dcp_call(loc, "loading", where, dcp.load, targets, storage_reader=reader,
              planner=SafeLoadPlanner(where), no_dist=True)
    return step, targets[key]


def list_checkpoints(url: str, storage_options: dict[str, Any] | None = None) -> list[CheckpointInfo]:
    """Committed checkpoints under ``url``, oldest first; uncommitted directories are ignored."""
    loc = resolve(url, storage_options)
    infos = []
    for step, directory in sorted(_committed_steps(loc).items()):
        marker = read_marker(loc, posixpath.join(directory, MARKER), step, f"step {step} at {loc.url}")
        try:
            size = retry(loc.fs.du, directory)
        except Exception as exc:
            raise loc.error("measure", directory, exc) from None
        infos.append(CheckpointInfo(step=step, committed_at=marker["committed_at"],
                                    world_size=marker["world_size"], size_bytes=size,
                                    url=loc.url_of(directory)))
    return infos
