"""`ShardedStream`: an IterableDataset over shard files whose progress is one count per shard.

Each (rank, worker) "slot" of a job of `S` slots reads the shards at positions `p` of the
epoch's shard order with `p % S == slot`, one after another. Within a shard, items are
shuffled in fixed blocks of `window` items, each block by its own seed
`(seed, epoch, shard, block)`, so the items of a shard already yielded are always the first
`count` of its shuffled order: one integer describes a shard's progress, whatever slot read
it. A resume at another world size or `num_workers` re-partitions the unfinished shards
over the new slots by the same rule and continues each one after its count (G2).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.randomness.seeds import derive_seed
from dist_resume.state.fields import ResumeStateError
from dist_resume.storage import guarded
from dist_resume.streams.prefetch import ShardFiles

# Yielded by `slot_items` after a shard's last item: the shard is finished.
SHARD_END = object()


class ShardedStream(IterableDataset):
    """Items of `shards` (local paths or fsspec URLs), read by `reader(binary file) ->
    Iterable[item]`, split over ranks and workers, in a deterministic order from `(seed, epoch)`.

    - `shuffle`: shuffle the shard order per epoch and the items of each shard in blocks of
      `window` items (memory: one block per worker).
    - `storage_options`: passed to `fsspec.open` (credentials, endpoint; G9). Each reader
      opens its next shard while it reads the current one (`ShardFiles`); a shard that
      cannot be opened is a `StorageError` naming its URL and the cause.
    - `reader`: one of `JsonlReader`, `ParquetReader`, `WebDatasetReader`, or your own.

    Through `ResumableDataLoader` its progress is saved as consumed items per shard, and a
    resume at any world size and `num_workers` yields every remaining item exactly once (G2).
    Slots read different amounts, so ranks may get different numbers of batches at the end
    of an epoch: DDP jobs should train a fixed number of steps, or use `join()`. Iterated by a
    plain DataLoader, it reads the epoch set by `set_epoch` (default 0) from the start.
    """

    def __init__(
        self,
        shards: Sequence[str],
        reader: Callable[[Any], Iterable[Any]],
        *,
        shuffle: bool = True,
        window: int = 1024,
        seed: int = 0,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(shards, str) or not all(isinstance(shard, str) for shard in shards):
            raise TypeError("shards must be a sequence of path or URL strings")
        if not callable(reader):
            raise TypeError(f"reader must be callable, got {type(reader).__name__}")
        window = checked_int("window", window, 1)
        seed = checked_int("seed", seed, 0, INT64_LIMIT)
        self.shards = list(shards)
        self.reader = reader
        self.shuffle = shuffle
        self.window = window
        self.seed = seed
        self.storage_options = guarded(storage_options)  # its repr shows no secret
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch a plain DataLoader reads next (ResumableDataLoader sets its own)."""
        self.epoch = checked_int("epoch", epoch, 0, INT64_LIMIT)

    @property
    def digest(self) -> int:
        """Identifies the shard list, order and shuffling: a saved state must match it."""
        names = zlib.crc32("\n".join(self.shards).encode())
        return derive_seed(len(self.shards), names, int(self.shuffle), self.window, self.seed)

    def shard_order(self, epoch: int) -> list[int]:
        """Shard indices in the order epoch `epoch` reads them."""
        if not self.shuffle:
            return list(range(len(self.shards)))
        generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
        return torch.randperm(len(self.shards), generator=generator).tolist()

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        ranks, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else (1, 0)
        zero = [0] * len(self.shards)
        for _, item in self.slot_items(self.epoch, rank * workers + worker, ranks * workers, zero, zero):
            if item is not SHARD_END:
                yield item

    def slot_items(
        self, epoch: int, slot: int, slots: int, consumed: Sequence[int], finished: Sequence[int]
    ) -> Iterator[tuple[int, Any]]:
        """(shard, item) for the items slot `slot` of `slots` still has to read in `epoch`,
        given the items `consumed` of each shard and the `finished` shards; (shard,
        SHARD_END) after each shard's last item."""
        mine = [shard for position, shard in enumerate(self.shard_order(epoch))
                if position % slots == slot and not finished[shard]]
        with ShardFiles([self.shards[shard] for shard in mine], self.storage_options) as files:
            for shard in mine:
                for item in self._shard_items(epoch, shard, consumed[shard], files):
                    yield shard, item
                yield shard, SHARD_END

    def _shard_items(self, epoch: int, shard: int, skip: int, files: ShardFiles) -> Iterator[Any]:
        consumed, read = skip, 0
        with files.open(self.shards[shard]) as file:
            items = iter(self.reader(file))
            block_index = 0
            while True:
                block = _take(items, self.window)
                read += len(block)
                if not block:
                    if skip:  # the state claims items this shard does not have
                        raise ResumeStateError(
                            f"loader state field 'consumed' says {consumed} items of shard {shard} "
                            f"({self.shards[shard]}) were read; it holds {read}"
                        )
                    return
                if skip >= len(block):  # consumed already: read past, do not shuffle
                    skip -= len(block)
                else:
                    yield from self._shuffled(block, epoch, shard, block_index)[skip:]
                    skip = 0
                block_index += 1

    def _shuffled(self, block: list[Any], epoch: int, shard: int, block_index: int) -> list[Any]:
        if not self.shuffle:
            return block
        generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch, shard, block_index))
        return [block[i] for i in torch.randperm(len(block), generator=generator).tolist()]


def _take(items: Iterator[Any], count: int) -> list[Any]:
    block = []
    for item in items:
        block.append(item)
        if len(block) == count:
            break
    return block
