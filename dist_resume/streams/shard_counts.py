"""Every shard's item count, learned once per job: in a job with a default process group,
each rank learns its share of the shards and the ranks exchange what they learned, so that
at many ranks every shard is counted once, not once per rank. A shard whose count is kept
in a counts cache (`counts_cache`) under its current identity is not read at all; what was
counted is kept there for the next start.

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
from dist_resume.streams.counts_cache import CountsCache
from dist_resume.streams.shard_identity import NO_IDENTITY

COUNTING_THREADS = 16
_SHOWN = 3  # disagreeing ranks named in an error
Learned = tuple[int, int]  # a shard's (identity, count)


def learn_all(indices: Sequence[int], learn: Callable[[int], Learned]) -> list[Learned]:
    """`learn(index)` of every shard index of `indices`, on `COUNTING_THREADS` threads."""
    with concurrent.futures.ThreadPoolExecutor(min(COUNTING_THREADS, max(len(indices), 1))) as pool:
        return list(pool.map(learn, indices))


def share(shards: int, ranks: int, rank: int) -> range:
    """The shards rank `rank` of `ranks` counts: a run of consecutive ones, every shard in one run."""
    return range(rank * shards // ranks, (rank + 1) * shards // ranks)


def shard_lengths(shards: Sequence[str], count: Callable[[str], int], identify: Callable[[str], int] | None,
                  cache: CountsCache | None, agreement: Sequence[int]) -> list[int]:
    """Every shard's item count: `count(url)` reads it, `identify(url)` its identity (from
    its storage's metadata), unless `cache` keeps its count under that identity; what was
    learned is kept in `cache` again when it differs. `agreement`: a few integers that every
    rank's shard list and reader must agree on."""
    kept = cache.read() if cache is not None else [None] * len(shards)

    def learn(index: int) -> Learned:
        url = shards[index]
        identity = identify(url) if cache is not None and identify is not None else NO_IDENTITY
        entry = kept[index]
        if identity != NO_IDENTITY and entry is not None and entry[0] == identity:
            return entry
        return identity, count(url)

    learned = counted(len(shards), learn, agreement)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    keepable = [entry if entry[0] != NO_IDENTITY else None for entry in learned]
    if cache is not None and keepable != kept and (rank == 0 or not cache.shared):  # a node's own disk: each rank
        cache.write(learned)
    return [count for _, count in learned]


def counted(shards: int, learn: Callable[[int], Learned], agreement: Sequence[int]) -> list[Learned]:
    """`learn(index)` of every shard index: alone without a default process group (or in
    a loader worker), else each rank learns its `share` and the ranks all-gather them."""
    if not (dist.is_available() and dist.is_initialized()) or get_worker_info() is not None \
            or dist.get_world_size() == 1:
        return learn_all(range(shards), learn)
    ranks, rank = dist.get_world_size(), dist.get_rank()
    device = collective_device()
    identities = _gathered(torch.tensor([shards, *agreement], dtype=torch.int64, device=device), ranks)
    _check_agreement(identities, rank)
    mine = share(shards, ranks, rank)
    failure: BaseException | None = None
    values: list[Learned] = [(NO_IDENTITY, 0)] * len(mine)
    try:
        values = learn_all(mine, learn)
    except Exception as exc:  # the others must not wait for counts that never come: tell them, raise here
        failure = exc
    width = -(-shards // ranks)  # the longest share: every rank sends as many values
    local = torch.zeros(1 + 2 * width, dtype=torch.int64)
    local[0] = failure is not None
    if values:
        local[1:1 + 2 * len(values)] = torch.tensor(values, dtype=torch.int64).flatten()
    everyone = _gathered(local.to(device), ranks)
    if failure is not None:
        raise failure
    failed = [other for other, values in enumerate(everyone) if values[0]]
    if failed:
        raise RuntimeError(f"ShardedStream: counting the shards' items failed on rank(s) {failed[:_SHOWN]} (their "
                           "own errors say why)")
    return [(pairs[0], pairs[1]) for other, sent in enumerate(everyone)
            for pairs in sent[1:1 + 2 * len(share(shards, ranks, other))].view(-1, 2).tolist()]


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
