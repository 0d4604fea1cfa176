"""Reading one shard file of a `ShardedStream`: its item count, and its items in their
shuffled order from any index, checked against that count.

A shard that cannot be opened or read fails with a `StorageError` that names the shard's
URL and the cause, secrets masked (G9), after the storage layer's retries of transient
errors; a shard that holds another number of items than its count is a `ShardCountError`
naming it: never a silent skip.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from dist_resume.errors import StorageError
from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.randomness.seeds import derive_seed
from dist_resume.storage import redact_url, resolve, retry
from dist_resume.streams.prefetch import ShardFiles
from dist_resume.streams.shard_identity import check_regular, shard_identity


UNSHUFFLED_BLOCK = 64  # items read at once from a shard read in file order


class ShardCountError(ValueError):
    """A shard holds another number of items than its count (`lengths=` or counted)."""


@contextlib.contextmanager
def opened(url: str, storage_options: dict[str, Any], files: ShardFiles | None = None) -> Iterator[Any]:
    """The shard at `url` open for binary reading (taken from `files` when they opened it
    ahead); any storage failure, while opening or while the body reads it, is one
    StorageError naming the shard and the cause."""
    # `files` resolve the URL to open it: resolved here again (~100 us) only to name a failure.
    location = resolve(url, storage_options) if files is None else None
    if location is not None:
        check_regular(location)
    try:
        with retry(location.fs.open, location.root, "rb") if location is not None else files.open(url) as file:
            yield file
    except (StorageError, ShardCountError):
        raise
    except Exception as exc:
        if isinstance(exc, OSError) or hasattr(exc, "response"):  # botocore's ClientError has a response
            location = location or resolve(url, storage_options)
            raise location.error("read shard", location.root, exc) from None
        exc.add_note(f"while reading shard {redact_url(url)}")
        raise


def identify(url: str, storage_options: dict[str, Any]) -> int:
    """The identity of the shard at `url` (`shard_identity`), learned from its metadata."""
    return shard_identity(resolve(url, storage_options))


def count_items(url: str, reader: Callable[[Any], Iterable[Any]], storage_options: dict[str, Any]) -> int:
    """Items of the shard at `url`: `reader.count(file)` when the reader offers it, else
    the items its `reader(file)` yields."""
    with opened(url, storage_options) as file:
        count = getattr(reader, "count", None)
        if callable(count):
            return int(count(file))
        return sum(1 for _ in reader(file))


class ShardItems:
    """The items of one shard as an epoch reads them: in blocks of `window` items, each
    shuffled by its own seed `(seed, epoch, shard, block)` (or in file order). With
    `seeding`, the reader reads each block with the global generators seeded from
    `(seeding.seed, shard, block)`, so that whatever it draws is the same whichever rank or
    worker reads the shard, from its start, as every reading does (G4)."""

    def __init__(self, reader: Callable[[Any], Iterable[Any]], storage_options: dict[str, Any],
                 window: int, shuffle_seed: int | None, seeding: ItemSeeding | None = None) -> None:
        self.reader = reader
        self.storage_options = storage_options
        self.window = window
        self.shuffle_seed = shuffle_seed  # derive_seed(seed, epoch); None: no shuffling
        self._seeding = seeding

    def blocks(self, url: str, shard: int, count: int, skip: int, stop: int,
               files: ShardFiles | None = None) -> Iterator[list[Any]]:
        """Items `[skip, stop)` of the shard's shuffled order, a list per block (so that a
        reader chains them at C speed, with no generator frame per item); its `count` is
        checked as far as the shard is read (to its end when `stop == count`). `files`: the
        reading stream's files, this shard's opened ahead. Closing the generator closes the
        shard."""
        # Unshuffled, a block only bounds what is held at once: a small one keeps few items
        # alive, which spares the garbage collector passes over them.
        window = self.window if self.shuffle_seed is not None else min(self.window, UNSHUFFLED_BLOCK)
        with opened(url, self.storage_options, files) as file:
            items = iter(self.reader(file))
            for block, start in enumerate(range(0, stop, window)):
                size = min(window, count - start)
                if self._seeding is not None:
                    self._seeding.block(derive_seed(self._seeding.seed, shard, block))
                values = list(itertools.islice(items, size))
                if len(values) < size:
                    raise ShardCountError(f"shard {redact_url(url)} holds {start + len(values)} items, fewer than "
                                          f"its count of {count}: {_CHANGED}")
                if start + size > skip:  # else consumed already: read past, no shuffling
                    values = self._shuffled(values, shard, block)
                    yield values if skip <= start and size <= stop - start else values[max(skip - start, 0):stop - start]
            if stop == count and next(items, _END) is not _END:
                raise ShardCountError(f"shard {redact_url(url)} holds more than its count of {count} items: {_CHANGED}")

    def place(self, shard: int, count: int, item: int) -> int:
        """Where item `item` (in file order) of shard `shard` (of `count` items) comes in
        the order `blocks` reads the shard in."""
        if self.shuffle_seed is None:
            return item
        block, within = divmod(item, self.window)
        return block * self.window + self._permutation(shard, block, min(self.window, count - block * self.window)
                                                       ).index(within)

    def _shuffled(self, block: list[Any], shard: int, index: int) -> list[Any]:
        if self.shuffle_seed is None:
            return block
        return [block[i] for i in self._permutation(shard, index, len(block))]

    def _permutation(self, shard: int, index: int, size: int) -> list[int]:
        generator = torch.Generator().manual_seed(derive_seed(self.shuffle_seed, shard, index))
        return torch.randperm(size, generator=generator).tolist()


_END = object()
_CHANGED = "the shard changed since it was counted, or lengths= is wrong"
