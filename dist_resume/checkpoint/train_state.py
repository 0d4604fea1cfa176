"""A model and its optimizer as one DCP `Stateful`, resharding as DCP does (DDP, FSDP2)."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


class TrainState:
    """`{"model": ..., "optim": ...}` through `get_state_dict`/`set_state_dict`: the usual
    recipe, so a checkpoint loads at another world size or parallelism."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
