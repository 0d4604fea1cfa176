"""Every shard's item count, counted once per job: in a job with a default process group,
each rank counts its share of the shards and the ranks exchange their counts, so that at
many ranks every shard is counted once, not once per rank.

The exchange runs on the job's default group, under its timeout: a rank that does not take
part in time fails every waiting rank with one error that says so. Ranks that disagree on
the shard list or reader, or a rank whose counting failed, fail every rank at once (never a
hang, never counts of other shards)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.utils.data import get_worker_info

from dist_resume.process_group import collective_device, peer_failure

COUNTING_THREADS = 16
_SHOWN = 3  # disagreeing ranks named in an error


def count_all(shards: Sequence[str], count: Callable[[str], int]) -> list[int]:
    """`count(shard)` of every shard, on `COUNTING_THREADS` threads."""
    with concurrent.futures.ThreadPoolExecutor(min(COUNTING_THREADS, max(len(shards), 1))) as pool:
        return list(pool.map(count, shards))


def share(shards: int, ranks: int, rank: int) -> range:
    """The shards rank `rank` of `ranks` counts: a run of consecutive ones, every shard in one run."""
    return range(rank * shards // ranks, (rank + 1) * shards // ranks)


def counted(shards: Sequence[str], count: Callable[[str], int], identity: Sequence[int]) -> list[int]:
    """Every shard's count: alone without a default process group (or in a loader worker),
    else each rank counts its `share` and the ranks all-gather the counts. `identity`: a few
    integers that every rank's shard list and reader must agree on."""
    if not (dist.is_available() and dist.is_initialized()) or get_worker_info() is not None \
            or dist.get_world_size() == 1:
        return count_all(shards, count)
    ranks, rank = dist.get_world_size(), dist.get_rank()
    device = collective_device()
    identities = _gathered(torch.tensor([len(shards), *identity], dtype=torch.int64, device=device), ranks)
    _check_agreement(identities, rank)
    mine = share(len(shards), ranks, rank)
    failure: BaseException | None = None
    values = [0] * len(mine)
    try:
        values = count_all([shards[index] for index in mine], count)
    except Exception as exc:  # the others must not wait for counts that never come: tell them, raise here
        failure = exc
    width = -(-len(shards) // ranks)  # the longest share: every rank sends as many values
    local = torch.zeros(width + 1, dtype=torch.int64)
    local[0] = failure is not None
    local[1:len(values) + 1] = torch.tensor(values, dtype=torch.int64)
    everyone = _gathered(local.to(device), ranks)
    if failure is not None:
        raise failure
    failed = [other for other, values in enumerate(everyone) if values[0]]
    if failed:
        raise RuntimeError(f"ShardedStream: counting the shards' items failed on rank(s) {failed[:_SHOWN]} (their "
                           "own errors say why)")
    return [count for other, sent in enumerate(everyone)
            for count in sent[1:len(share(len(shards), ranks, other)) + 1].tolist()]


def _gathered(tensor: torch.Tensor, ranks: int) -> list[torch.Tensor]:
    """Every rank's `tensor`, as CPU tensors; a peer that is gone or late is one clear error."""
    gathered = [torch.empty_like(tensor) for _ in range(ranks)]
    try:
        dist.all_gather(gathered, tensor)
    except RuntimeError as exc:
        message = peer_failure(exc, "ShardedStream: exchanging the shards' item counts")
        if message is None:
            raise
        raise RuntimeError(message) from None
    return [values.cpu() for values in gathered]


def _check_agreement(identities: list[torch.Tensor], rank: int) -> None:
    own = identities[rank]
    others = [other for other, values in enumerate(identities) if not torch.equal(values, own)]
    if others:
        raise ValueError(
            f"ShardedStream: ranks disagree on the shard list, its shuffling or the reader (rank {rank}: {int(own[0])} shards; "
            + ", ".join(f"rank {other}: {int(identities[other][0])} shards" for other in others[:_SHOWN])
            + (", ..." if len(others) > _SHOWN else "") + "; or other shards of the same number, shuffle, window, "
            "seed or reader): every rank must build the stream from the same shard URLs, in the same order, with the "
            "same settings and reader")
