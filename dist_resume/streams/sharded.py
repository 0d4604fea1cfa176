"""`ShardedStream`: an IterableDataset over shard files, read by canonical streams so that
its global batches are the same at every world size and `num_workers` (G3)."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset, get_worker_info

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.randomness.seeds import derive_seed
from dist_resume.storage import guarded
from dist_resume.streams.canonical import stream_lengths
from dist_resume.streams.counts_cache import counts_cache as cache_of
from dist_resume.streams.reader_identity import reader_digest
from dist_resume.streams.shard_counts import shard_lengths
from dist_resume.streams.shard_files import ShardItems, count_items, identify
from dist_resume.streams.stream_reader import CanonicalReader, ItemTransform

MAX_CANONICAL_STREAMS = 2**20
_READER_SEEDS = 0x7265616465  # salt of the reader's block seeds: they differ from the items'


class ShardedStream(IterableDataset):
    """Items of `shards` (local paths or fsspec URLs), read by `reader(binary file) ->
    Iterable[item]`, in a deterministic order from `(seed, epoch)`.

    Through `ResumableDataLoader` (GUARANTEES G1-G3, G5, G6 for streams):

    - The epoch is read by `canonical_streams` canonical streams (`C`): the epoch's shards
      (in an order shuffled per epoch with `shuffle`), each one's items shuffled in fixed
      blocks of `window` items, are cut into `C` consecutive runs of equal length (a shard
      may be cut in two); stream `c` reads run `c`. The epoch order takes one item of each
      stream in turn, and global step `k` holds its positions `[k*G, (k+1)*G)`, laid out
      stream after stream; rank `r` takes `[r*b, (r+1)*b)` of that layout. The
      global batches therefore depend only on the shards, their item counts, the reader,
      `seed`, `shuffle`, `window`, `canonical_streams` and the global batch `G`: they are
      the same at every world size and `num_workers`, through any number of resumes (G3).
      `None`: the slot count (world size x workers) of the run that starts the stream,
      saved in the state and adopted by a resume.
    - Every item once per epoch across any resumes, also at another `G` (G2): a resume at
      another world size or `G` continues from the epoch position every saved rank reached.
    - Every rank gets the same number of batches per epoch (`len(loader)`): `drop_last` and
      `even_batches` mean what they mean for map-style data (G2); the final step's padding
      repeats items from the start of the same canonical streams.
    - Extra reading: a rank reads only the canonical streams its batches take items from,
      each by one of its workers, reading on past other ranks' items and skipping whole
      shards by their counts. With `world_size` dividing `C` and `C` dividing `G`, each
      stream is read by one rank, so each shard once per epoch (bytes read / shard bytes
      1.00), but for: the prefix of a shard cut between two streams, read by both (at most
      `C - 1` shards; none when the streams' runs end on shard boundaries), up to `window
      - 1` items read past a stream's end in such a shard, and, when the final step is
      padded, each stream's first window read again. With `C` dividing `G` but
      `world_size` not dividing `C`, each of the `world_size - 1` rank boundaries falls
      inside one stream's chunk, read by two ranks: at most `1 + (world_size - 1) / C`
      times the above. When `C` does not divide `G` the boundaries move from step to step
      and more streams are shared: keep `G` a multiple of `C` (benchmarks B8).
    - With `in_order=False` each worker reads whole batches of its own run of items and the
      loader hands on whichever arrives first; every item once per epoch across resumes at
      any layout, in another order (no G3; docs/slow-steps.md).
    - Per-item randomness (G4), with the loader's `deterministic_transforms` on (the
      default): `transform(item) -> item`, applied in the worker to each item a batch takes
      (after the window shuffle; not to items read past), sees the global generators
      (`torch`, `random`, `numpy`; those named by a set) seeded from the loader's `(seed,
      epoch, position)`, the item's epoch position as above, and `sample_seed()` /
      `sample_generator()` work inside it: an item's augmentation is the same at every world
      size and `num_workers`, and after any resume. The reader reads each block of `window`
      items of a shard with them seeded from `(seed, epoch, shard, block)`, so whatever it
      draws is the same whoever reads the shard (unless the reader's `draws_randomness` is
      False, as the ready-made readers': nothing to seed); put augmentation in `transform`.
    - State: per rank a few integers (the canonical stream count, `G`, the epoch position
      of its next batch, digests of the shards' counts and of the reader), whatever the
      number of shards (G5). A state for other shards, `canonical_streams`, reader or
      counts is refused naming the field (G6).

    `lengths`: every shard's item count. Default: counted once, when a loader first needs
    it, by `reader.count(file)` if the reader has that attribute (a Parquet footer, say),
    else by iterating `reader(file)`, on 16 threads. In a job with a default process group
    (`torch.distributed` initialized), each rank counts `1 / world_size` of the shards and
    the ranks all-gather the counts under the group's timeout: every rank must build the
    stream from the same shards and reader (refused with one error otherwise) and reach its
    first count together, as the loaders of a data-parallel job do. At many shards on
    remote storage, pass `lengths` (saved with the data) to skip that pass. A
    shard holding another number of items than its count fails with a `ShardCountError`
    naming it; one that cannot be read, with a `StorageError` naming it and the cause.

    A worker keeps one shard open per canonical stream it reads, and opens the stream's
    next shard while it reads the current one (`streams/prefetch.py`): a `C` far above the
    slot count means many open files (and connections) per worker. Readers for JSONL,
    Parquet and WebDataset tar: `JsonlReader`, `ParquetReader`, `WebDatasetReader`.

    `storage_options` go to fsspec (credentials, endpoint; G9). Iterated by a plain
    DataLoader, slot `s` of `S` (rank x worker) reads the canonical streams `c % S == s` of
    the epoch set by `set_epoch` (default 0), from the start; without `lengths`, call
    `lengths()` before, or every worker counts every shard.
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
        transform: Callable[[Any], Any] | None = None,
        counts_cache: str | os.PathLike | bool | None = True,
    ) -> None:
        if isinstance(shards, str) or not all(isinstance(shard, str) for shard in shards):
            raise TypeError("shards must be a sequence of path or URL strings")
        if not callable(reader):
            raise TypeError(f"reader must be callable, got {type(reader).__name__}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable or None, got {type(transform).__name__}")
        self.shards = list(shards)
        self.reader = reader
        self.transform = transform
        self.shuffle = shuffle
        self.window = checked_int("window", window, 1)
        self.seed = checked_int("seed", seed, 0, INT64_LIMIT)
        self.storage_options = guarded(storage_options)  # its repr shows no secret
        if not isinstance(counts_cache, (str, os.PathLike, bool)) and counts_cache is not None:
            raise TypeError(f"counts_cache must be a folder's path or URL, True (the default folder) or None, got "
                            f"{type(counts_cache).__name__}")
        self.counts_cache = counts_cache
        self.canonical_streams = None if canonical_streams is None else checked_int(
            "canonical_streams", canonical_streams, 1, MAX_CANONICAL_STREAMS + 1)
        self._lengths: list[int] | None = None
        self._lengths_digest: int | None = None
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
        return reader_digest(self.reader)

    def reader_change(self, saved_digest: int) -> str | None:
        """What differs between the reader a state was saved with (its digest) and this
        stream's, when the reader can tell (its `explain_digest`); else None."""
        explain = getattr(self.reader, "explain_digest", None)
        return explain(saved_digest) if callable(explain) else None

    def lengths(self) -> list[int]:
        """Every shard's item count (given, or counted once and kept; in a job with a
        default process group every rank must call it, each counting its share)."""
        if self._lengths is None:
            options = self.storage_options
            self._lengths = shard_lengths(self.shards, lambda url: count_items(url, self.reader, options),
                                          lambda url: identify(url, options),
                                          cache_of(self.counts_cache, self.shards, self.reader, options),
                                          (self.digest, self.reader_digest))
        return self._lengths

    def lengths_digest(self) -> int:
        """Identifies every shard's item count: a saved state must match it."""
        if self._lengths_digest is None:  # kept: every state_dict() reports it
            self._lengths_digest = derive_seed(len(self.shards), *self.lengths())
        return self._lengths_digest

    def shard_order(self, epoch: int) -> list[int]:
        """Shard indices in the order epoch `epoch` reads them."""
        if not self.shuffle:
            return list(range(len(self.shards)))
        generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
        return torch.randperm(len(self.shards), generator=generator).tolist()

    def stream_lengths(self, canonical_streams: int) -> list[int]:
        """Items of each of `canonical_streams` canonical streams (the same every epoch)."""
        return stream_lengths(sum(self.lengths()), canonical_streams)

    def item_place(self, epoch: int, shard: int, item: int) -> int:
        """Where item `item` (in file order) of shard `shard` comes among the shard's items
        as epoch `epoch` reads them (shuffled in blocks of `window`, or in file order)."""
        return self._shard_items(epoch).place(shard, self.lengths()[shard], item)

    def _shard_items(self, epoch: int, blocks: ItemSeeding | None = None) -> ShardItems:
        seed = derive_seed(self.seed, epoch) if self.shuffle else None
        return ShardItems(self.reader, self.storage_options, self.window, seed, blocks)

    def canonical_reader(self, epoch: int, stream: int, canonical_streams: int,
                         seeding: ItemSeeding | None = None) -> CanonicalReader:
        """Canonical stream `stream`'s items of epoch `epoch`, by index, each through
        `transform`; with `seeding`, under its seed `(seeding.seed, epoch, position)`."""
        lengths = self.lengths()
        # A reader that draws nothing is read unseeded: seeding would cost ~30 us a batch, for nothing.
        draws = getattr(self.reader, "draws_randomness", True)
        blocks = None if seeding is None or not draws else seeding.derived(_READER_SEEDS, epoch)
        items = self._shard_items(epoch, blocks)
        spans = stream_spans(self.shard_order(epoch), lengths, canonical_streams, stream)
        transform = None if self.transform is None else ItemTransform(self.transform, seeding, epoch, stream,
                                                                      canonical_streams)
        return CanonicalReader([(self.shards[shard], shard, lengths[shard], first, end) for shard, first, end in spans],
                               items, transform)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        ranks, rank = (dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else (1, 0)
        slots, slot = ranks * workers, rank * workers + worker
        canonical_streams = self.canonical_streams or slots
        for stream in range(slot, canonical_streams, slots):
            yield from self.canonical_reader(self.epoch, stream, canonical_streams).all()


def stream_spans(order: Sequence[int], lengths: Sequence[int], canonical_streams: int,
                 stream: int) -> list[tuple[int, int, int]]:
    """(shard, first item, end item) of the shards' items that canonical stream `stream`
    reads: its run of the epoch's shards, in `order`, one after another. A shard may be cut
    between two streams; an empty shard goes to the stream its place falls in."""
    runs = stream_lengths(sum(lengths), canonical_streams)
    begin = sum(runs[:stream])
    end = begin + runs[stream]
    last = stream == canonical_streams - 1
    spans, offset = [], 0
    for shard in order:
        length = lengths[shard]
        first, stop = max(begin, offset), min(end, offset + length)
        if first < stop or (length == 0 and (begin <= offset < end or last and offset == end)):
            spans.append((shard, first - offset, stop - offset if length else 0))
        offset += length
        if offset > end:
            break
    return spans
