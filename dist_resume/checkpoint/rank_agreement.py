"""Every rank of a collective save or load names the same storage location (G7)."""

from __future__ import annotations

import torch.distributed as dist

from dist_resume.errors import CheckpointError
from dist_resume.storage import Location


def require_same_location(loc: Location, group: dist.ProcessGroup | None, action: str) -> None:
    """Raise the same :class:`CheckpointError` on every rank of ``group`` unless all of them
    resolved the checkpoint URL to the same filesystem and path: ranks that write to
    different places (per-rank or relative URLs, different endpoints) would commit a step
    that lacks some ranks' shards, or load different runs."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return
    place = (type(loc.fs).__name__, loc.root, getattr(loc.fs, "endpoint_url", None))
    printable = loc.root if loc.is_local else loc.url  # a local root is absolute: cwd shows
    every: list[tuple[tuple[object, ...], str] | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, (place, printable), group=group)
    places: dict[tuple[object, ...], tuple[str, list[int]]] = {}
    for rank, (theirs, shown) in enumerate(every):  # type: ignore[misc]
        places.setdefault(theirs, (shown, []))[1].append(rank)
    if len(places) == 1:
        return
    listed = "; ".join(f"ranks {ranks}: {shown}" for shown, ranks in places.values())
    raise CheckpointError(
        f"cannot {action}: the ranks do not name the same checkpoint location ({listed}); "
        "every rank must pass the same URL, on storage that every rank can reach"
    )
