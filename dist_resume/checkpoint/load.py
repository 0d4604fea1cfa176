"""Reading committed checkpoints: ``load_checkpoint`` (elastic for the data loader's
entries, G2), ``read_loader_states`` and ``list_checkpoints``. "Latest" is the newest
committed step; nothing in a checkpoint is executed (G8).
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.stateful import Stateful

from dist_resume.arguments import checked_int, checked_url
from dist_resume.checkpoint.async_saves import wait_for_previous_save
from dist_resume.checkpoint.bounded_reader import BoundedReader
from dist_resume.checkpoint.collector import collector_paused
from dist_resume.checkpoint.collectives import dcp_call, on_every_rank, on_rank0, peers_answer
from dist_resume.checkpoint.metadata_checks import read_metadata
from dist_resume.checkpoint.nested import set_path
from dist_resume.checkpoint.rank_agreement import require_agreement
from dist_resume.checkpoint.run_history import note_load
from dist_resume.checkpoint.rank_tables import entries_from_table, own_entries
from dist_resume.checkpoint.split_metadata import read_shared, tabled_keys, with_rank_entries
from dist_resume.checkpoint.commit_index import index_entries, indexed_size, vouched
from dist_resume.checkpoint.digests import METADATA_DIGEST, checked_digests
from dist_resume.checkpoint.step_dirs import (MARKER, Commit, commits, marked_steps, marker_tags, newest_commit,
                                              read_commit, refuse_misplaced, step_dir, step_directories)
from dist_resume.checkpoint.stored_values import SafeLoadPlanner
from dist_resume.errors import CheckpointCorruptError, CheckpointError, CheckpointNotFoundError
from dist_resume.state.fields import ELASTIC_GUARD_KEY, ResumeStateError, rank_of
from dist_resume.state.rank_table import RANK_TABLE_KEY
from dist_resume.storage import CheckpointStore, guarded, open_store, resolve


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as ``list_checkpoints`` reports it."""

    step: int
    committed_at: float  # seconds since the epoch
    world_size: int
    size_bytes: int
    url: str  # printable: credentials removed


def _choose(store: CheckpointStore, step: int | None, every_entry: set[str] | None,
            steps: dict[int, str]) -> tuple[int, str, Metadata, bool, dict[str, str]] | None:
    """The committed ``step`` (default: the latest) of ``steps`` (the location's step
    directories, `step_directories`), its data directory, its metadata,
    whether that metadata lacks the loaders' rank entries (`split_metadata`: for a step
    saved with it, unless a loader under a key of ``every_entry`` receives every saved
    rank's entries; None: every loader does), and the digests its commit recorded; None if
    the location holds nothing."""
    found = newest_commit(store, steps) if step is None else \
        read_commit(store, step, steps[step]) if step in steps else None
    if found is None:
        committed = [] if step is None else commits(store, steps)
        if not committed:
            refuse_misplaced(store)
        if step is None:
            return None
        raise CheckpointNotFoundError(f"step {step} is not committed at {store.loc.url} (committed steps: "
                                      f"{', '.join(str(commit.step) for commit in committed) or 'none'})")
    step, directory = found.step, found.data
    where = f"step {step} at {store.loc.url}"
    recorded = checked_digests(found.marker, where)
    with _pruned_is_not_damage(store, step):
        shared = None if every_entry is None else read_shared(store.loc, directory, where, every_entry, recorded)
        if shared is not None:
            return step, directory, shared, True, recorded
        return step, directory, read_metadata(store.loc, directory, where, recorded.get(METADATA_DIGEST)), False, \
            recorded


def _with_own_entries(store: CheckpointStore, step: int, directory: str, shared: Metadata,
                      state: dict[str, Any], recorded: dict[str, str]) -> Metadata:
    """``shared`` with the saved rank entries that the loaders of ``state`` read whole."""
    ranks = set()
    for key in tabled_keys(shared) & state.keys():
        ranks.update(rank_of(name) for name in own_entries(state[key]) or ())
    with _pruned_is_not_damage(store, step):
        return with_rank_entries(store.loc, directory, shared, ranks, f"step {step} at {store.loc.url}", recorded)


@contextmanager
def _pruned_is_not_damage(store: CheckpointStore, step: int) -> Iterator[None]:
    """Files of ``step`` that vanish while it loads are damage only if the step is still
    committed; else another job's save pruned it (``keep=``), and the caller is told so."""
    try:
        yield
    except CheckpointCorruptError:
        if store.exists(posixpath.join(step_dir(store, step), MARKER)):
            raise
        raise CheckpointNotFoundError(
            f"step {step} at {store.loc.url} was removed while it was being loaded (a save with keep= pruned "
            "it?); load again to take the newest committed step"
        ) from None


def _read(store: CheckpointStore, step: int, directory: str, metadata: Metadata, targets: dict[str, Any],
          **dcp_options: Any) -> None:
    """Load ``targets`` from the checked step in ``directory``, plain data only (G8)."""
    where = f"step {step} at {store.loc.url}"
    reader = BoundedReader(store.loc, directory, metadata, where)
    with _pruned_is_not_damage(store, step):
        dcp_call(store.loc, "loading", where, dcp.load, targets, storage_reader=reader,
                 planner=SafeLoadPlanner(where), **dcp_options)


_LOADER_ENTRY_LIMIT = 2**27  # elements of one saved loader entry (a rank table's column at 2**20 ranks: ~2**24)


def _placeholder(fqn: str, entry: Any, where: str) -> torch.Tensor | None:
    """What a loader's saved entry ``entry`` is read into (its size a claim of the metadata)."""
    if not isinstance(entry, TensorStorageMetadata):
        return None  # a stored value: the safe planner replaces it
    if math.prod(entry.size) > _LOADER_ENTRY_LIMIT:
        raise CheckpointCorruptError(f"{where} is damaged: loader entry '{fqn}' declares {math.prod(entry.size)} "
                                     f"elements, more than {_LOADER_ENTRY_LIMIT}")
    return torch.zeros(entry.size, dtype=entry.properties.dtype)


def _load_targets(state: dict[str, Any], metadata: Metadata, where: str) -> tuple[dict[str, Any], dict[str, bool]]:
    """What DCP loads into: ``state``, except that entries saved with the elastic guard get
    a template of what is read of every saved rank, built from the metadata: with a rank
    table, the table, the replicated entries and the loader's own rank entry; without one
    (a step saved before tables, or a target that is not a loader), every rank's entries.
    Also, per elastic key, whether it was read through its table."""
    saved = metadata.state_dict_metadata
    targets: dict[str, Any] = {}
    elastic = {}
    for key, value in state.items():
        if f"{key}.{ELASTIC_GUARD_KEY}" not in saved:
            targets[key] = value
            continue
        own = own_entries(value) if any(fqn.startswith(f"{key}.{RANK_TABLE_KEY}.") for fqn in saved) else None
        template: dict[str, Any] = {}
        for fqn, entry in saved.items():
            path = metadata.planner_data[fqn]
            if path[0] == key and len(path) > 1 and _read_whole(path[1], own, where):
                set_path(template, path, _placeholder(fqn, entry, where))
        targets[key] = template[key]
        elastic[key] = own is not None
    return targets, elastic


def _read_whole(name: Any, own: set[str] | None, where: str) -> bool:
    """Whether a loader's saved entry ``name`` is read (``own``: its rank entries read whole,
    None: every rank's, as before rank tables)."""
    try:
        rank = rank_of(name)
    except ResumeStateError as exc:
        raise CheckpointCorruptError(f"{where} is damaged: {exc}") from None
    if own is None:
        return name != RANK_TABLE_KEY
    return rank is None or name in own


def load_checkpoint(
    state: dict[str, Any],
    url: str,
    step: int | None = None,
    *,
    storage_options: dict[str, Any] | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> int | None:
    """Load committed ``step`` (default: the latest) from ``url`` into ``state``; return it.

    Collective: every rank passes the same URL and ``step`` (ranks that differ all raise
    one :class:`CheckpointError` before anything is read). Returns None when ``url`` holds
    no committed step (first start), so a training script can call it unconditionally; an
    explicit ``step`` that is not committed raises :class:`CheckpointNotFoundError`.
    Entries whose saved state carries the elastic guard (the data loader) receive every
    saved rank's entries, whatever the world size then and now. Nothing in the checkpoint is
    executed (G8): ``.metadata`` admits only DCP's types, stored values only plain data.
    """
    storage_options = guarded(storage_options)  # secrets never shown in captured locals
    step = None if step is None else checked_int("step", step, 0)
    loc = resolve(checked_url(url), storage_options)
    wait_for_previous_save()
    store = open_store(loc)
    with peers_answer(f"cannot load {'a checkpoint' if step is None else f'step {step}'} at {loc.url}", process_group):
        require_agreement(loc, process_group, "load", step=step)
        with collector_paused():
            every_entry = {key for key, value in state.items() if not isinstance(value, Stateful)}
            found: list[set[int]] = []  # rank 0's: the steps committed at the run, for run_history

            def choose() -> tuple[int, str, Metadata, bool, dict[str, str]] | None:
                steps = step_directories(store)
                found.append(marked_steps(store, steps))
                return _choose(store, step, every_entry, steps)

            chosen = on_rank0(process_group, choose)
            if chosen is None:
                if found:
                    note_load(loc, None, found[0])
                return None
            step, directory, metadata, split, recorded = chosen
            if split:  # each rank reads its own entries' metadata
                shared = metadata
                metadata = on_every_rank(
                    process_group, lambda: _with_own_entries(store, step, directory, shared, state, recorded),
                    f"cannot load step {step} at {loc.url}")
            targets, elastic = _load_targets(state, metadata, f"step {step} at {loc.url}")
            _read(store, step, directory, metadata, targets, process_group=process_group)
    with collector_paused():
        for key, tabled in elastic.items():
            if tabled:
                targets[key] = entries_from_table(targets[key])
        for key, value in state.items():
            if key in elastic and isinstance(value, Stateful):
                value.load_state_dict(targets[key])
            elif not isinstance(value, Stateful):
                state[key] = targets[key]
    if found:
        note_load(loc, step, found[0] | {step})
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
    Returns ``(step, state)``; the state feeds ``dist_resume.state.saved.decode`` or ``plan_resume``.
    Loads plain data only (G8)."""
    storage_options = guarded(storage_options)  # secrets never shown in captured locals
    step = None if step is None else checked_int("step", step, 0)
    loc = resolve(checked_url(url), storage_options)
    store = open_store(loc)
    with collector_paused():
        return _loader_states(store, step, key)


def _loader_states(store: CheckpointStore, step: int | None, key: str) -> tuple[int, dict[str, Any]]:
    loc = store.loc
    chosen = _choose(store, step, None, step_directories(store))
    if chosen is None:
        raise CheckpointNotFoundError(f"no committed checkpoint at {loc.url}")
    step, directory, metadata, _, _ = chosen
    if f"{key}.{ELASTIC_GUARD_KEY}" not in metadata.state_dict_metadata:
        guard = f".{ELASTIC_GUARD_KEY}"
        keys = sorted(fqn[: -len(guard)] for fqn in metadata.state_dict_metadata if fqn.endswith(guard))
        held = f"it holds loader states under {', '.join(map(repr, keys))}" if keys else "it holds none"
        raise CheckpointError(f"step {step} at {loc.url} holds no data loader state under {key!r}; {held}")
    targets, _ = _load_targets({key: None}, metadata, f"step {step} at {loc.url}")
    _read(store, step, directory, metadata, targets, no_dist=True)
    return step, targets[key]


def list_checkpoints(url: str, storage_options: dict[str, Any] | None = None) -> list[CheckpointInfo]:
    """Committed checkpoints under ``url``, oldest first: the steps whose commit markers say
    so, as for loading (a step directory without one is ignored, a damaged one is an error);
    a location that holds something else than checkpoints is refused (as by load_checkpoint).
    Steps pruned while they are listed are left out."""
    storage_options = guarded(storage_options)  # secrets never shown in captured locals
    store = open_store(resolve(checked_url(url), storage_options))
    steps = step_directories(store)
    entries, tags = (index_entries(store), marker_tags(store)) if steps else ({}, {})
    # A marker whose tag is the MD5 its index entry recorded is the marker committed: not read again.
    known = {step: summary for step in steps if (summary := vouched(entries.get(step, ()), tags.get(step)))}
    found = commits(store, {step: directory for step, directory in steps.items() if step not in known})
    if not found and not known:
        refuse_misplaced(store)
    infos = [CheckpointInfo(step=step, committed_at=summary.committed_at, world_size=summary.world_size,
                            size_bytes=summary.size_bytes, url=store.loc.url_of(steps[step]))
             for step, summary in known.items()]
    with ThreadPoolExecutor(_LISTING_READS) as pool:  # small reads: their latency, not bandwidth, adds up
        infos += pool.map(lambda commit: _info(store, commit, entries.get(commit.step, ())), found)
    return sorted(infos, key=lambda info: info.step)


_LISTING_READS = 16


def _info(store: CheckpointStore, commit: Commit, entries: Any) -> CheckpointInfo:
    """``commit``'s step as its marker says it, with the size of its files that the index
    says (or, for a step it does not name, measured)."""
    size = indexed_size(store, commit.step, entries, commit.marker)
    if size is None:
        size = store.tree_size(commit.directory)
    return CheckpointInfo(step=commit.step, committed_at=commit.marker["committed_at"],
                          world_size=commit.marker["world_size"], size_bytes=size, url=store.loc.url_of(commit.directory))
