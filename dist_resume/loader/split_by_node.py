"""Hugging Face `datasets` with `ResumableDataLoader`: one check, that a map-style dataset
is not sharded twice.

The loader shards one epoch order over the ranks, which is right only when every rank holds
the same dataset. `datasets.distributed.split_dataset_by_node` already gives each rank its
own part, so the loader would shard that part again: each rank would read 1/N of its part
and (N-1)/N of the data would never be trained, silently (G2). No legitimate use needs both:
a job that wants every rank to read only its own part says so with `rank=0, world_size=1`,
and then the loader shards nothing and this check does not run. So it is an error, not a
warning.
"""

from __future__ import annotations

import hashlib
import sys
from typing import Any

import torch.distributed as dist

# Rows compared across ranks: cheap, and enough to tell two parts of one dataset apart.
_SAMPLE_ROWS = 3


def check_not_split_by_node(dataset: Any, rank: int, world_size: int, process_group: Any = None) -> None:
    """Raise `ValueError` if the ranks of this loader hold different Hugging Face map-style
    datasets (for example parts made by `split_dataset_by_node`). A collective over the
    loader's process group, run only for a `datasets.Dataset` at world size > 1."""
    hf_datasets = sys.modules.get("datasets")  # a datasets.Dataset means the package is loaded
    if world_size == 1 or hf_datasets is None or not isinstance(dataset, getattr(hf_datasets, "Dataset", ())):
        return
    if not (dist.is_available() and dist.is_initialized()):
        return
    group = process_group.get_group() if hasattr(process_group, "get_group") else process_group
    if (dist.get_rank(group), dist.get_world_size(group)) != (rank, world_size):
        return  # rank and world size given by hand, not this group's: nothing to compare with
    digests: list[Any] = [None] * world_size
    dist.all_gather_object(digests, _digest(dataset), group=group)
    if len(set(digests)) > 1:
        lengths = ", ".join(f"rank {index}: {length}" for index, (length, _) in enumerate(digests))
        raise ValueError(
            f"the ranks hold different datasets (rows per rank: {lengths}): ResumableDataLoader shards the "
            "dataset over the ranks itself, so give every rank the whole dataset. A dataset split with "
            "datasets.distributed.split_dataset_by_node would be sharded twice (each rank reading 1/"
            f"{world_size} of its part); to read only each rank's own part, pass rank=0, world_size=1 "
            "(resume is then per rank, not elastic)"
        )


def _digest(dataset: Any) -> tuple[int, str]:
    rows = len(dataset)
    picks = sorted({round(i * (rows - 1) / (_SAMPLE_ROWS - 1)) for i in range(_SAMPLE_ROWS)}) if rows else []
    # The stored rows, in the dataset's order, before any transform or decoding (a random
    # transform or a decoded image would differ between processes).
    table = dataset.with_format("arrow")[picks]
    return rows, hashlib.sha256(repr(table.to_pylist()).encode()).hexdigest()
