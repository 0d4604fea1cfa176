"""Each save's rank table: the fields of every saved rank's loader entry that a resume at
another world size reads of all ranks (progress, holes of in_order=False, skipped ranges, a
stream's position), gathered to rank 0 at save and written beside the per-rank entries, so
that a load reads them with a request per field, whatever the number of saved ranks. The
per-rank entries stay: a same-size resume and plain ``dcp.load`` read their own; a step
saved without a table loads every rank's entries, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from dist_resume.checkpoint.collectives import checkpoint_group, distributed
from dist_resume.checkpoint.entry_fields import SHARED_FIELDS, check_entry_fields
from dist_resume.checkpoint.nested import set_path
from dist_resume.state.fields import ELASTIC_GUARD_KEY, rank_key, rank_of
from dist_resume.state.rank_table import RANK_TABLE_KEY, decode_column, encode_column

def taken_states(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with each Stateful's state dict taken (once, as DCP would), its data loaders'
    entries checked to hold declared fields only (`check_entry_fields`)."""
    saved = {key: value.state_dict() if isinstance(value, Stateful) else value for key, value in state.items()}
    check_entry_fields(saved)
    return saved


def with_rank_tables(saved: Mapping[str, Any], group: dist.ProcessGroup | None) -> dict[str, Any]:
    """``saved`` (`taken_states`) as DCP saves it: on rank 0 with each data loader's rank
    table, gathered from every rank of ``group``. Collective: every rank calls it with its
    loaders under the same keys (as the save's agreement on skipped ranges checks)."""
    saved = dict(saved)
    for key in sorted(key for key, value in saved.items() if isinstance(value, Mapping) and ELASTIC_GUARD_KEY in value):
        parts = _gathered(_rows(saved[key]), group)
        if parts is not None:
            saved[key] = {**saved[key], RANK_TABLE_KEY: _table(parts)}
    return saved


def _rows(loader_state: Mapping[str, Any]) -> torch.Tensor:
    """This process's rank entries' shared fields: records ``[rank, field, length, values...]``."""
    records = []
    for key, entry in loader_state.items():
        rank = rank_of(key)  # check_entry_fields refused the save of a malformed one
        if rank is None or not isinstance(entry, Mapping):
            continue
        for index, path in enumerate(SHARED_FIELDS):
            value = _at(entry, path)
            if value is not None:  # a 1-D int64 tensor, as check_entry_fields made sure
                records += [torch.tensor([rank, index, len(value)], dtype=torch.int64), value.detach().cpu()]
    return torch.cat(records) if records else torch.zeros(0, dtype=torch.int64)


def _at(entry: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        if not isinstance(entry, Mapping):
            return None
        entry = entry.get(name)
    return entry


def _gathered(rows: torch.Tensor, group: dist.ProcessGroup | None) -> list[torch.Tensor] | None:
    """Every rank's ``rows`` on rank 0 (over the save's gloo group, under the job's timeout),
    None on the other ranks."""
    if not distributed() or dist.get_world_size(group) == 1:
        return [rows]
    gloo = checkpoint_group(group)
    longest = torch.tensor([len(rows)], dtype=torch.int64)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=gloo)
    padded = torch.zeros(int(longest) + 1, dtype=torch.int64)
    padded[0] = len(rows)
    padded[1:1 + len(rows)] = rows
    ours = dist.get_rank(gloo) == 0
    parts = [torch.empty_like(padded) for _ in range(dist.get_world_size(gloo))] if ours else None
    dist.gather(padded, parts, group=gloo, group_dst=0)
    return [part[1:1 + int(part[0])] for part in parts] if parts is not None else None


def _table(parts: list[torch.Tensor]) -> dict[str, Any]:
    columns: dict[int, dict[int, torch.Tensor]] = {}
    for part in parts:
        at = 0
        while at < len(part):
            rank, index, length = part[at:at + 3].tolist()
            columns.setdefault(index, {})[rank] = part[at + 3:at + 3 + length]
            at += 3 + length
    table: dict[str, Any] = {}
    for index, rows in sorted(columns.items()):
        set_path(table, SHARED_FIELDS[index], encode_column(rows))
    return table


def own_entries(value: Any) -> set[str] | None:
    """The rank entries a loader about to load reads whole (its own, as its state dict names
    them); None for a value that is not a Stateful (it receives every saved rank's entries)."""
    if not isinstance(value, Stateful):
        return None
    current = value.state_dict()
    return {key for key in current if rank_of(key) is not None} if isinstance(current, Mapping) else set()


def entries_from_table(loaded: Mapping[str, Any]) -> dict[str, Any]:
    """A loader state with every saved rank's entry: the shared fields of each from the rank
    table, with the fields that were loaded of the loader's own entry (whole, or its own
    fields only: `split_metadata`) as they were saved."""
    table = loaded[RANK_TABLE_KEY]
    merged: dict[str, Any] = {}
    for path in SHARED_FIELDS:
        column = _at(table, path)
        if column is None:
            continue
        *groups, leaf = path
        for rank, values in decode_column(column, f"loader state's rank table field {'.'.join(path)!r}").items():
            entry = merged.setdefault(rank_key(rank), {})  # set_path's generality costs ~1 us a rank
            for group in groups:
                entry = entry.setdefault(group, {})
            entry[leaf] = values
    for key, value in loaded.items():
        if key != RANK_TABLE_KEY:
            _merge(merged, key, value)
    return merged


def _merge(into: dict[str, Any], name: str, value: Any) -> None:
    """``value`` placed at ``name``; a mapping merged field by field into the one there."""
    if isinstance(value, Mapping) and isinstance(into.get(name), dict):
        for field, inner in value.items():
            _merge(into[name], field, inner)
    else:
        into[name] = value
