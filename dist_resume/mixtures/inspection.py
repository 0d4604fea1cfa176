"""What `dist-resume inspect` prints for a Mixture's loader state, without its datasets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..dataset_order import DEFINITION_KEY
from ..state import ResumeStateError, SavedStates
from .definition import Definition
from .progress import frontier, source_progress
from .schedule import Schedule


def describe(state_dict: Mapping[str, Any], saved: SavedStates) -> list[str]:
    """Lines on the mixture of a loader state: its stages, the run position reached and,
    per source, the draws before it and the source-epoch they are in; [] if no mixture."""
    values = state_dict.get(DEFINITION_KEY)
    if values is None:
        return []
    if not isinstance(values, torch.Tensor) or values.dtype != torch.int64:
        raise ResumeStateError(f"loader state's {DEFINITION_KEY!r} is not an int64 tensor")
    definition = Definition.decode(values.tolist())
    position = frontier(saved)
    length = saved.any.dataset_length
    lines = [f"  mixture of {len(definition.names)} sources, weights (quotas) {definition.describe_stages()}",
             f"  run position {position} (epoch {position // length}, position {position % length}): "
             "every consumed position is below it"]
    for progress in source_progress(definition, Schedule(definition.stages), position).values():
        lines.append(f"  source {progress.name!r}: {progress.draws} draws, in source-epoch {progress.epoch} "
                     f"with {progress.within} of {progress.length} samples read")
    return lines
