"""`ShardedStream`: an IterableDataset over shard files, read by canonical streams so that
its global batches are the same at every world size and `num_workers` (G3)."""

from __future__ import annotations

import concurrent.futures
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.randomness.seeds import derive_seed
from dist_resume.storage import guarded
from dist_resume.streams.canonical import EpochOrder
from dist_resume.streams.shard_files import ShardItems, count_items
from dist_resume.streams.stream_reader import CanonicalReader

COUNTING_THREADS = 16
MAX_CANONICAL_STREAMS = 2**20


class ShardedStream(IterableDataset):
    """Items of `shards` (local paths or fsspec URLs), read by `reader(binary file) ->
    Iterable[item]`, in a deterministic order from `(seed, epoch)`.

    Through `ResumableDataLoader` (GUARANTEES G1-G3, G5, G6 for streams):

    - The epoch is read by `canonical_streams` canonical streams: stream `c` reads the
      shards at positions `p % C == c` of the epoch's shard order (shuffled per epoch with
      `shuffle`), each shard's items shuffled in fixed blocks of `window` items. Global step
      `k` takes the next `G // C` items (one more for the first `G % C` streams) of every
      stream, laid out stream after stream; once a stream runs short, its share is split
      over the streams that still have items. Rank `r` takes slice `[r*b, (r+1)*b)`. The
      global batches therefore depend only on the shards, their item counts, the reader,
      `seed`, `shuffle`, `window`, `canonical_streams` and the global batch `G`: they are
      the same at every world size and `num_workers`, through any number of resumes.
      `None`: the slot count (world size x workers) of the run that starts the stream,
      saved in the state and adopted by a resume.
    - Every rank gets the same number of batches per epoch: `drop_last` and `even_batches`
      mean what they mean for map-style data (G2), so DDP cannot hang at an epoch's end.
    - Extra reading: each rank reads only the shards holding items of its batches,
      skipping whole shards by their counts, and each canonical stream a rank needs is read
      by one of its workers. With `world_size` dividing `canonical_streams` and
      `canonical_streams` dividing `G`, every shard is read exactly once per epoch (plus
      the padding, at most `G - 1` items from the epoch's start). Otherwise every rank
      boundary that falls inside a stream's chunk makes two ranks read that stream: at
      most `world_size - 1` streams read twice while every stream has items, and after the
      first stream runs dry at most every rank reading each remaining shard once.
    - State: per rank a few integers (the canonical stream count, `G`, the global step,
      digests of the shards' counts and of the reader), whatever the number of shards.

    `lengths`: every shard's item count. Default: counted once, when a loader first needs
    it, by `reader.count(file)` if the reader has that attribute (a Parquet footer, say),
    else by iterating `reader(file)`, on `COUNTING_THREADS` threads of every rank: at many
    shards on remote storage, pass `lengths` (saved with the data) to skip that pass. A
    shard holding another number of items than its count fails with a `ShardCountError`
    naming it; one that cannot be read, with a `StorageError` naming it and the cause.

    `storage_options` go to fsspec (credentials, endpoint; G9). Iterated by a plain
    DataLoader, slot `s` of `S` (rank x worker) reads the canonical streams `c % S == s` of
    the epoch set by `set_epoch` (default 0), from the start.
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
        canonical_streams: int | None = None,
        lengths: Sequence[int] | None = None,
    ) -> None:
        if isinstance(shards, str) or not all(isinstance(shard, str) for shard in shards):
            raise TypeError("shards must be a sequence of path or URL strings")
        if not callable(reader):
            raise TypeError(f"reader must be callable, got {type(reader).__name__}")
        self.shards = list(shards)
        self.reader = reader
        self.shuffle = shuffle
        self.window = checked_int("window", window, 1)
        self.seed = checked_int("seed", seed, 0, INT64_LIMIT)
        self.storage_options = guarded(storage_options)  # its repr shows no secret
        self.canonical_streams = None if canonical_streams is None else checked_int(
            "canonical_streams", canonical_streams, 1, MAX_CANONICAL_STREAMS + 1)
        self._lengths: list[int] | None = None
        if lengths is not None:
            if isinstance(lengths, (str, bytes)) or len(lengths) != len(self.shards):
                raise ValueError(f"lengths must hold one item count per shard ({len(self.shards)})")
            self._lengths = [checked_int(f"lengths[{i}]", count, 0, INT64_LIMIT) for i, count in enumerate(lengths)]
        self.epoch = 0

    kind_name = "ShardedStream"  # what errors call it (see streams.steps)

    @property
    def saved_length(self) -> int:
        """What a loader's state calls the dataset length: the number of shards."""
        return len(self.shards)

    def set_epoch(self, epoch: int) -> None:
        """The epoch a plain DataLoader reads next (ResumableDataLoader sets its own)."""
        self.epoch = checked_int("epoch", epoch, 0, INT64_LIMIT)

    @property
    def digest(self) -> int:
        """Identifies the shard list, order and shuffling: a saved state must match it."""
        names = zlib.crc32("\n".join(self.shards).encode())
        return derive_seed(len(self.shards), names, int(self.shuffle), self.window, self.seed)

    @property
    def reader_digest(self) -> int:
        """Identifies the reader: its `digest` attribute if it has one, else its qualified name."""
        own = getattr(self.reader, "digest", None)
        if isinstance(own, int) and not isinstance(own, bool):
            return own % INT64_LIMIT
        kind = self.reader if hasattr(self.reader, "__qualname__") else type(self.reader)
        return zlib.crc32(f"{kind.__module__}.{kind.__qualname__}".encode())

    def lengths(self) -> list[int]:
        """Every shard's item count (given, or counted once and kept)."""
        if self._lengths is None:
            with concurrent.futures.ThreadPoolExecutor(min(COUNTING_THREADS, max(len(self.shards), 1))) as pool:
                self._lengths = list(pool.map(lambda url: count_items(url, self.reader, self.storage_options),
                                              self.shards))
        return self._lengths

    def lengths_digest(self) -> int:
        return derive_seed(len(self.shards), *self.lengths()) if self.shards else 0

    def shard_order(self, epoch: int) -> list[int]:
        """Shard indices in the order epoch `epoch` reads them."""
        if not self.shuffle:
            return list(range(len(self.shards)))
        generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
        return torch.randperm(len(self.shards), generator=generator).tolist()

    def epoch_order(self, epoch: int, canonical_streams: int) -> EpochOrder:
        """Epoch `epoch`'s order of items over `canonical_streams` streams."""
        order, lengths = self.shard_order(epoch), self.lengths()
        return EpochOrder([sum(lengths[shard] for shard in order[c::canonical_streams])
                           for c in range(canonical_streams)])

    def canonical_reader(self, epoch: int, stream: int, canonical_streams: int) -> CanonicalReader:
        """Canonical stream `stream`'s items of epoch `epoch`, by index."""
        shards = self.shard_order(epoch)[stream::canonical_streams]
        seed = derive_seed(self.seed, epoch) if self.shuffle else None
        items = ShardItems(self.reader, self.storage_options, self.window, seed)
        return CanonicalReader([(self.shards[shard], shard, self.lengths()[shard]) for shard in shards], items)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        ranks, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else (1, 0)
        slots, slot = ranks * workers, rank * workers + worker
        canonical_streams = self.canonical_streams or slots
        for stream in range(slot, canonical_streams, slots):
            yield from self.canonical_reader(self.epoch, stream, canonical_streams).all()
