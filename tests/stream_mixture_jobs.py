"""Two JSONL stream sources (and a map-style one) mixed with a stage change, and jobs of
several ranks over them (importable by worker processes and by the gloo ranks of
tests/stream_mixture_worker.py)."""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any

import fsspec
from torch.utils.data import Dataset

from dist_resume import Mixture, ResumableDataLoader
from dist_resume.streams import ShardedStream
from tests.stream_jobs import read_jsonl

# Item ids: source base + shard * 1000 + index; the map-style source's: MAP_BASE + index.
SOURCES = {"web": (0, (40, 0, 3, 97, 1, 0, 12, 25)), "code": (100_000, (30, 7, 20, 5))}
MAP_BASE, MAP_LENGTH = 500_000, 23
# The stage change falls inside the second job of the chains below (global batch 12).
STAGES = [(0, {"web": 3, "code": 1}), (60, {"web": 1, "code": 2})]
MIXED_STAGES = [(0, {"web": 3, "code": 1, "table": 1}), (60, {"web": 1, "code": 2, "table": 1})]
LENGTH = 240  # positions per loader epoch: 20 global steps of 12; "code" wraps into a 2nd source-epoch
GLOBAL_BATCH = 12


def source_items(name: str) -> list[int]:
    """Every item of a source, sorted."""
    if name == "table":
        return list(range(MAP_BASE, MAP_BASE + MAP_LENGTH))
    base, sizes = SOURCES[name]
    return sorted(base + shard * 1000 + i for shard, size in enumerate(sizes) for i in range(size))


def source_of(item: int) -> str:
    return "table" if item >= MAP_BASE else "code" if item >= SOURCES["code"][0] else "web"


def write_sources(root: str) -> dict[str, list[str]]:
    """One JSONL file per shard of every stream source under `root`."""
    urls: dict[str, list[str]] = {}
    for name, (base, sizes) in SOURCES.items():
        for shard, size in enumerate(sizes):
            url = f"{root}/{name}-{shard:02d}.jsonl"
            with fsspec.open(url, "w") as file:
                file.writelines(json.dumps({"id": base + shard * 1000 + i}) + "\n" for i in range(size))
            urls.setdefault(name, []).append(url)
    return urls


class Table(Dataset):
    """The map-style source: item `i` is MAP_BASE + i."""

    def __len__(self) -> int:
        return MAP_LENGTH

    def __getitem__(self, index: int) -> int:
        return MAP_BASE + index


def make_mixture(urls: dict[str, list[str]], mixed: bool = False, stages: Any = None, **options: Any) -> Mixture:
    sources: dict[str, Any] = {"web": ShardedStream(urls["web"], read_jsonl, window=8, seed=11),
                               "code": ShardedStream(urls["code"], read_jsonl, window=4, seed=5)}
    if mixed:
        sources["table"] = Table()
    return Mixture(sources, stages or (MIXED_STAGES if mixed else STAGES), LENGTH, **options)


def job(mixture: Mixture, world_size: int, num_workers: int, state: dict[str, Any] | None,
        steps: int | None) -> tuple[list[list[int]], dict[str, Any]]:
    """The global steps of a job of `world_size` ranks (each rank's batches joined in rank
    order) that loads `state` and takes `steps` batches (None: to the epoch's end), and the
    merged state of all its ranks."""
    per_rank, merged = [], {}
    for rank in range(world_size):
        loader = ResumableDataLoader(mixture, batch_size=GLOBAL_BATCH // world_size, num_workers=num_workers,
                                     rank=rank, world_size=world_size, shuffle=True, seed=3)
        if state is not None:
            loader.load_state_dict(state)
        per_rank.append([batch.tolist() for batch in itertools.islice(loader, steps)])
        merged.update(loader.state_dict())
    assert len({len(batches) for batches in per_rank}) == 1, "ranks got different numbers of batches"
    return [sum((batches[step] for batches in per_rank), []) for step in range(len(per_rank[0]))], merged


def assert_once_per_source_epoch(steps: list[list[int]]) -> None:
    """Every source's items, in the order of the global steps, come exactly once per
    source-epoch: the `k`-th run of `len(source)` draws holds each item once (a step
    straddling two source-epochs may lay their items out in either order, so the check is
    per count: after `D` draws every item came `D // len` or `D // len + 1` times, the
    latter for `D % len` items)."""
    drawn: dict[str, list[int]] = {}
    for item in (item for step in steps for item in step):
        drawn.setdefault(source_of(item), []).append(item)
    for name, items in drawn.items():
        every = source_items(name)
        full, extra = divmod(len(items), len(every))
        counts = Counter(items)
        assert set(counts) <= set(every), name
        assert Counter(counts[item] for item in every) == +Counter({full: len(every) - extra, full + 1: extra}), name
        assert len(set(items[: len(every) - GLOBAL_BATCH])) == len(items[: len(every) - GLOBAL_BATCH]), name


def assert_window_bounds(mixture: Mixture, steps: list[list[int]], stages: Any) -> None:
    """Each global step inside one stage holds each source's share of it within the
    mixture's window bound."""
    starts = [start for start, _ in stages] + [LENGTH]
    for number, step in enumerate(steps):
        first, end = number * GLOBAL_BATCH, (number + 1) * GLOBAL_BATCH
        for (start, weights), stop in zip(stages, starts[1:]):
            if start <= first and end <= stop:
                counts = Counter(source_of(item) for item in step)
                for name, weight in weights.items():
                    share = weight / sum(weights.values())
                    assert abs(counts[name] - share * GLOBAL_BATCH) < mixture.window_bound(name), (number, name)
