"""DataPipes (torch's `IterDataPipe`) read as streams: each reader of a pass takes its share
of one shuffled order, as under torch's DataLoader."""

from __future__ import annotations

import warnings
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


def warn_if_unsplit(pipe: Any, readers: int) -> None:
    """A DataPipe read by several readers (ranks x workers) splits only at its
    `sharding_filter`: without one, every reader reads all of it, and each item comes
    `readers` times an epoch (as under torch's DataLoader). Say so."""
    if readers < 2 or not isinstance(pipe, IterDataPipe):
        return
    pipes = graph_settings.get_all_graph_pipes(graph_settings.traverse_dps(pipe))
    if not any(graph_settings._is_sharding_datapipe(each) for each in pipes):
        warnings.warn(f"ResumableDataLoader: this DataPipe has no sharding_filter, so each of its {readers} readers "
                      f"(ranks x workers) reads all of it and every item comes {readers} times an epoch; add "
                      ".sharding_filter() where the pipe should split", stacklevel=4)
