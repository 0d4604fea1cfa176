"""The defaults a `ResumableDataLoader` takes when not told: its seed and its data-parallel shard."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.state.fields import MAX_WORLD_SIZE


def default_seed(generator: torch.Generator | None, world_size: int) -> int:
    if generator is None and world_size > 1:
        return 0
    if generator is not None:
        # Drawn from a copy: the user's generator goes on to seed the workers exactly as
        # under torch's DataLoader (its first draw of an iterator is the workers' base seed).
        copy = torch.Generator(device=generator.device)
        copy.set_state(generator.get_state())
        generator = copy
    # RandomSampler's draw: int64 random_() covers [0, 2**63).
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def data_parallel_shard(rank: int | None, world_size: int | None, process_group) -> tuple[int, int]:
    if (rank is None) != (world_size is None):
        raise ValueError(f"give both rank and world_size, or neither (got rank={rank}, world_size={world_size})")
    if rank is None:
        if isinstance(process_group, DeviceMesh):
            if process_group.ndim != 1:
                raise ValueError(
                    f"process_group is a {process_group.ndim}-D DeviceMesh; pass its data-parallel "
                    'dimension, for example mesh["dp"]'
                )
            process_group = process_group.get_group()
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
        elif process_group is not None:
            raise ValueError("process_group was given but torch.distributed is not initialized")
        else:
            rank, world_size = 0, 1
    rank, world_size = checked_int("rank", rank, 0), checked_int("world_size", world_size, 1, MAX_WORLD_SIZE + 1)
    if not rank < world_size:
        raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}")
    return rank, world_size


def check_global_batch(batch_size: int | None, world_size: int) -> None:
    """Refuse a per-rank ``batch_size`` (an int >= 1, as torch checked) whose global batch
    does not fit the int64 it is saved as."""
    if batch_size is not None and batch_size * world_size >= INT64_LIMIT:
        raise ValueError(f"batch_size {batch_size} x world_size {world_size}, the global batch, is saved as int64: "
                         "it must be below 2**63")
