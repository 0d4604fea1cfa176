"""Every rank of a collective save or load names the same storage location and passes the
same arguments (G7), agreed in one collective before anything is written or read."""

from __future__ import annotations

import torch.distributed as dist

from dist_resume.checkpoint.collectives import distributed
from dist_resume.errors import CheckpointError
from dist_resume.storage import Location


def _disagreement(values: list[tuple[object, str]]) -> str | None:
    """``"ranks [0]: a; ranks [1]: b"`` when the compared values (one ``(value, shown)``
    per rank) are not all equal; None when they are."""
    ranks: dict[object, tuple[str, list[int]]] = {}
    for rank, (value, shown) in enumerate(values):
        ranks.setdefault(value, (shown, []))[1].append(rank)
    if len(ranks) == 1:
        return None
    return "; ".join(f"ranks {members}: {shown}" for shown, members in ranks.values())


def require_agreement(loc: Location, group: dist.ProcessGroup | None, verb: str, *,
                      skipped: dict[str, str] | None = None, refusal: str | None = None,
                      **arguments: object) -> None:
    """Raise the same :class:`CheckpointError` on every rank of ``group`` unless all of them
    resolved the checkpoint URL to the same filesystem and path and pass equal
    ``arguments`` (``step``, ``keep``, ...). Ranks that write to different places (per-rank
    or relative URLs, different endpoints) would commit a step that lacks some ranks'
    shards, or load different runs; ranks that pass different steps would commit rank 0's
    step with every rank's data, and ranks that differ on ``async_save`` would wait for
    each other forever. ``verb`` ("save", "load") names the call in the error. ``skipped``
    (a save's data loaders, by key, and the ranges each skipped) must agree too: ranks that
    skipped different batches would save a state that trains some samples on one rank only.
    ``refusal`` is this rank's own reason to refuse the call (its message): every rank raises
    it, rather than the others waiting in the call's next collective for a rank that left it."""
    if not distributed() or dist.get_world_size(group) == 1:
        _raise_refusals([refusal], verb, arguments.get("step"), alone=True)
        return
    place = (type(loc.fs).__name__, loc.root, getattr(loc.fs, "endpoint_url", None))
    printable = loc.root if loc.is_local else loc.url  # a local root is absolute: cwd shows
    every: list[tuple[tuple[object, ...], str, dict[str, object], dict[str, str], str | None] | None] = \
        [None] * dist.get_world_size(group)
    dist.all_gather_object(every, (place, printable, arguments, skipped or {}, refusal), group=group)
    places = _disagreement([(theirs, shown) for theirs, shown, *_ in every])  # type: ignore[misc]
    differing = {name: _disagreement([(theirs[name], repr(theirs[name]))  # type: ignore[misc]
                                      for _, _, theirs, *_ in every]) for name in arguments}
    _raise_refusals([theirs[-1] for theirs in every], verb,  # type: ignore[index]
                    arguments.get("step") if differing.get("step") is None else None)
    loader_skips = [theirs for *_, theirs, _ in every]  # type: ignore[misc]
    skips = {key: _disagreement([(theirs.get(key), theirs.get(key, "no such loader")) for theirs in loader_skips])
             for key in sorted({key for theirs in loader_skips for key in theirs})}
    problems, advice = [], []
    if places is not None:
        problems.append(f"do not name the same checkpoint location ({places})")
        advice.append("every rank must pass the same URL, on storage that every rank can reach")
    for name, listed in differing.items():
        if listed is not None:
            problems.append(f"{'nor' if problems else 'do not pass'} the same {name} ({listed})")
    if len(advice) < len(problems):
        *first, last = arguments
        advice.append(f"every rank must pass the same {', '.join(first)}{' and ' if first else ''}{last}")
    uneven = [f"{key!r} ({listed})" for key, listed in skips.items() if listed is not None]
    if uneven:
        problems.append(f"{'and ' if problems else ''}have data loaders that skipped different batches: "
                        + ", ".join(uneven))
        advice.append("every rank must call loader.skip() with the same number of batches")
    if not problems:
        return
    step = arguments.get("step")
    action = f"{verb} step {step}" if step is not None and differing.get("step") is None else f"{verb} a checkpoint"
    raise CheckpointError(f"cannot {action}: the ranks {' '.join(problems)}; {'; '.join(advice)}")


def _raise_refusals(refusals: list[str | None], verb: str, step: object, alone: bool = False) -> None:
    """One :class:`CheckpointError` naming each refusing rank (unless the process is ``alone``)
    and its reason, if any refused."""
    ranks: dict[str, list[int]] = {}
    for rank, refusal in enumerate(refusals):
        if refusal is not None:
            ranks.setdefault(refusal, []).append(rank)
    if not ranks:
        return
    reasons = "; ".join(reason if alone else f"rank{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}: "
                        f"{reason}" for reason, members in ranks.items())
    raise CheckpointError(f"cannot {verb} {'a checkpoint' if step is None else f'step {step}'}: {reasons}")
