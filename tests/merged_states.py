"""The loader state dicts of every rank of a job as one dict: what a checkpoint holds and
dist_resume.load_checkpoint hands to each rank of the next job (ranks simulated in one process)."""

from __future__ import annotations

from collections.abc import Iterable

from dist_resume import ResumableDataLoader


def merged(*state_dicts: dict) -> dict:
    """The union of `state_dicts`, in order: a key of a later one replaces that of an earlier one."""
    result: dict = {}
    for state in state_dicts:
        result.update(state)
    return result


def merged_from(loaders: Iterable[ResumableDataLoader]) -> dict:
    """The merged state dicts of `loaders`, each taken now, in their order."""
    return merged(*(loader.state_dict() for loader in loaders))
