"""`ResumableDataLoader` under the names the peer suites construct: torch's `DataLoader` and
torchdata's `StatefulDataLoader` (whose `snapshot_every_n_steps` maps to `snapshot_every`)."""

from __future__ import annotations

from typing import Any

from dist_resume import ResumableDataLoader


class PeerDataLoader(ResumableDataLoader):
    def __init__(self, dataset: Any, *args: Any, snapshot_every_n_steps: int = 1, **kwargs: Any) -> None:
        kwargs.setdefault("snapshot_every", snapshot_every_n_steps)
        super().__init__(dataset, *args, **kwargs)


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
