"""JSONL shards and simulated jobs of several ranks over a ShardedStream (importable by
worker processes and by the gloo ranks of tests/stream_worker.py)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import fsspec

from dist_resume import ResumableDataLoader
from dist_resume.streams import ShardedStream

# Very different sizes, two empty shards, one of a single item.
SHARD_SIZES = (40, 0, 3, 97, 1, 0, 12, 25)


def item_id(shard: int, index: int) -> int:
    return shard * 1000 + index


def all_items() -> list[int]:
    return sorted(item_id(shard, i) for shard, size in enumerate(SHARD_SIZES) for i in range(size))


def write_shards(root: str, storage_options: dict[str, Any] | None = None) -> list[str]:
    """One JSONL file per entry of SHARD_SIZES under `root` (a path or URL)."""
    urls = []
    for shard, size in enumerate(SHARD_SIZES):
        url = f"{root}/shard-{shard:02d}.jsonl"
        with fsspec.open(url, "w", **(storage_options or {})) as file:
            file.writelines(json.dumps({"id": item_id(shard, i)}) + "\n" for i in range(size))
        urls.append(url)
    return urls


def read_jsonl(file) -> Any:
    for line in file:
        yield json.loads(line)["id"]


def make_stream(urls: list[str], storage_options: dict[str, Any] | None = None, **options: Any) -> ShardedStream:
    return ShardedStream(urls, read_jsonl, window=8, seed=11, storage_options=storage_options, **options)


def make_loader(stream: ShardedStream, rank: int, world_size: int, num_workers: int) -> ResumableDataLoader:
    # even_batches=False: no padding, so "every item exactly once" is the whole epoch
    # (tests/test_stream_determinism.py checks the padded and dropped ends).
    return ResumableDataLoader(stream, batch_size=4, num_workers=num_workers, rank=rank, world_size=world_size,
                               even_batches=False)


def run_ranks(
    make: Callable[[int], ResumableDataLoader], world_size: int, state: dict[str, Any] | None, steps: int | None
) -> tuple[list[list[int]], dict[str, Any]]:
    """Every rank of a job, one after another in this process, makes its loader with
    `make(rank)`, loads `state` and takes `steps` batches (None: to the epoch's end); returns
    the items each rank consumed and the merged state of all ranks, as
    dist_resume.load_checkpoint hands it to every rank of the next job."""
    consumed, merged = [], {}
    for rank in range(world_size):
        loader = make(rank)
        if state is not None:
            loader.load_state_dict(state)
        consumed.append([item for batch in itertools.islice(loader, steps) for item in batch.tolist()])
        merged.update(loader.state_dict())
    return consumed, merged


def run_job(
    stream: ShardedStream, world_size: int, num_workers: int, state: dict[str, Any] | None, steps: int | None
) -> tuple[list[list[int]], dict[str, Any]]:
    """`run_ranks` with the loaders of `make_loader`."""
    return run_ranks(lambda rank: make_loader(stream, rank, world_size, num_workers), world_size, state, steps)


def flat(per_rank: list[list[int]]) -> list[int]:
    return sorted(item for items in per_rank for item in items)
