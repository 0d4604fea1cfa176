"""`ResumableDataLoader` under the names the peer suites construct: torch's `DataLoader` and
torchdata's `StatefulDataLoader` (whose `snapshot_every_n_steps` maps to `snapshot_every`).

torchdata's states are plain JSON-able values (its suite calls `json.dumps(state_dict())`);
ours hold int64 tensors for DCP, so the shim hands out the documented JSON form
(`state_to_json`) and takes back either form."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from dist_resume import ResumableDataLoader, state_from_json, state_to_json

_T_co = TypeVar("_T_co", covariant=True)


class PeerDataLoader(ResumableDataLoader[_T_co]):
    constructed = 0  # in this process: shows that the suite ran ours, not torch's class

    def __init__(self, dataset: Any, *args: Any, snapshot_every_n_steps: int = 1, **kwargs: Any) -> None:
        PeerDataLoader.constructed += 1
        # A cost knob in both loaders (resume is exact at any value); torchdata's 0 means
        # "only when asked", which ours reads as its default period.
        kwargs.setdefault("snapshot_every", snapshot_every_n_steps if snapshot_every_n_steps > 0 else 16)
        super().__init__(dataset, *args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return json.loads(state_to_json(super().state_dict()))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_from_json(json.dumps(state_dict)))


def install() -> None:
    """Make `torch.utils.data.DataLoader` and torchdata's `StatefulDataLoader` name
    `PeerDataLoader` for modules imported from now on. Our own modules keep torch's class:
    they were imported first and bound it already."""
    import torch.utils.data

    try:
        import torchdata.stateful_dataloader as stateful
    except ImportError:
        stateful = None
    if stateful is not None:
        stateful.StatefulDataLoader = PeerDataLoader
    torch.utils.data.DataLoader = PeerDataLoader
