"""Datasets whose positions are the training order (a `Mixture`): the loader asks them,
not `EpochOrder`, which item each position reads, and saves and checks their definition.

A dataset takes part by defining all four of:

- `position_order(seed, epoch, shuffle)`: an object whose `indices(positions)` (int64
  tensor of positions of `epoch`) returns the keys to read them with (`dataset[key]`);
- `definition_state()`: its definition as a list of ints, saved in the loader state
  under `DEFINITION_KEY` (replicated, G8);
- `definition_digest()`: an int that a state must share with the loader (G6);
- `resume_definition(values, saved, state_dict)`: called by `load_state_dict` before the
  identity check with the saved definition (None if the state has none), the decoded
  states and the loader state itself;
  raises `ResumeStateError`, or returns what to apply once the whole state is accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from dist_resume.positions.epoch_order import EpochOrder
from dist_resume.state.fields import ResumeStateError
from dist_resume.state.saved import SavedStates

DEFINITION_KEY = "dataset_definition"


def owns_order(dataset: Any) -> bool:
    return callable(getattr(dataset, "position_order", None))


def position_order(dataset: Any, length: int, seed: int, epoch: int, shuffle: bool) -> Any:
    """What maps the positions of `epoch` to the keys the dataset is read with."""
    if owns_order(dataset):
        return dataset.position_order(seed, epoch, shuffle)
    return EpochOrder(length, seed, epoch, shuffle)


def definition_digest(dataset: Any) -> int:
    return dataset.definition_digest() if owns_order(dataset) else 0


def save_definition(dataset: Any, state_dict: dict[str, Any]) -> None:
    if owns_order(dataset):
        state_dict[DEFINITION_KEY] = torch.tensor(dataset.definition_state(), dtype=torch.int64)


def saved_definition(state_dict: Mapping[str, Any]) -> list[int] | None:
    """The dataset definition a loader state holds, None if it holds none."""
    values = state_dict.get(DEFINITION_KEY)
    if values is None:
        return None
    if not (isinstance(values, torch.Tensor) and values.dtype == torch.int64 and values.dim() == 1):
        raise ResumeStateError(f"loader state's {DEFINITION_KEY!r} is not a 1-D int64 tensor")
    return values.tolist()


def resume_definition(dataset: Any, state_dict: Mapping[str, Any], saved: SavedStates) -> Callable[[], None]:
    """Checks the saved definition against the dataset's; returns what adopts it."""
    if owns_order(dataset):
        return dataset.resume_definition(saved_definition(state_dict), saved, state_dict)
    return lambda: None
