"""What `dist-resume inspect` prints for a Mixture's loader state, without its datasets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dist_resume.mixtures.definition import Definition
from dist_resume.mixtures.progress import frontier, source_progress
from dist_resume.mixtures.schedule import Schedule
from dist_resume.positions.dataset_order import saved_definition
from dist_resume.state.saved import SavedStates


def describe(state_dict: Mapping[str, Any], saved: SavedStates) -> list[str]:
    """Lines on the mixture of a loader state: its stages, the run position reached and,
    per source, the draws before it and the source-epoch they are in; [] if no mixture."""
    values = saved_definition(state_dict)
    if values is None:
        return []
    definition = Definition.decode(values)
    position = frontier(saved, state_dict)
    length = saved.any.dataset_length
    lines = [f"  mixture of {len(definition.names)} sources, weights (quotas) {definition.describe_stages()}",
             f"  run position {position} (epoch {position // length}, position {position % length}): "
             "every consumed position is below it"]
    if definition.tokens is not None:  # which source each position read depends on the data's tokens
        lines.append(f"  weights count tokens, over sources of {definition.describe_tokens()} per source-epoch: "
                     "each source's draws follow from the data (Mixture.progress(state))")
        return lines
    for progress in source_progress(definition, Schedule(definition.stages), position).values():
        lines.append(f"  source {progress.name!r}: {progress.draws} draws, in source-epoch {progress.epoch} "
                     f"with {progress.within} of {progress.length} samples read")
    return lines
