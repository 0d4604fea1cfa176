"""DataPipes (torch's `IterDataPipe`) read as streams: each reader of a pass takes its share
of one shuffled order, as under torch's DataLoader."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch.utils.data import IterDataPipe, graph_settings


class PipeSettings(NamedTuple):
    """What every reader of one pass applies to a DataPipe graph: the seed of its random
    DataPipes (one for all ranks and workers, from the loader's seed and the epoch) and
    this rank's place among the ranks."""

    seed: int
    rank: int
    world_size: int


def configure(pipe: Any, settings: PipeSettings, role: int, roles: int) -> None:
    """Seed `pipe`'s random DataPipes and give its `sharding_filter`s this reader's shard (the
    instance numbering of torch's DataLoader: worker-major over ranks). Not a DataPipe:
    nothing. Without this, every worker of every rank would read the whole pipe."""
    if not isinstance(pipe, IterDataPipe):
        return
    graph_settings.apply_random_seed(pipe, torch.Generator().manual_seed(settings.seed))
    graph_settings.apply_sharding(pipe, roles * settings.world_size, role * settings.world_size + settings.rank)
