"""Datasets with stragglers for the in_order=False tests (importable by worker processes)."""

from __future__ import annotations

import json
import time

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class Gated(Dataset):
    """Sample i is `(i, a torch draw)`; the samples in `slow` wait until `gate` (a
    multiprocessing Event) is set, so that a test decides when their batch can arrive."""

    def __init__(self, length: int, slow: set[int], gate) -> None:
        self.length = length
        self.slow = slow
        self.gate = gate

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if index in self.slow and not self.gate.wait(timeout=60):
            raise TimeoutError(f"sample {index} waited 60 s for its gate")
        return index, torch.rand(()).item()


class Stragglers(Dataset):
    """One sample in `every` takes `delay` seconds (a large image, a remote read)."""

    def __init__(self, length: int, every: int = 16, delay: float = 0.04) -> None:
        self.length = length
        self.every = every
        self.delay = delay

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if index % self.every == self.every - 1:
            time.sleep(self.delay)
        return index


class GatedReader:
    """A JSONL reader of `tests.stream_jobs` shards whose items in `slow` wait until `gate`
    (a multiprocessing Event) is set: a straggler that a test releases when it decides."""

    def __init__(self, slow: set[int], gate) -> None:
        self.slow = slow
        self.gate = gate

    def __call__(self, file):
        for line in file:
            item = json.loads(line)["id"]
            if item in self.slow and not self.gate.wait(timeout=60):
                raise TimeoutError(f"item {item} waited 60 s for its gate")
            yield item


class WorkerSplit(IterableDataset):
    """Items 0 .. length-1, worker w of n yielding those with i % n == w; the items in `slow`
    wait until `gate` (a multiprocessing Event) is set."""

    def __init__(self, length: int, slow: set[int] = frozenset(), gate=None) -> None:
        self.length = length
        self.slow = slow
        self.gate = gate

    def __iter__(self):
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        for item in range(worker, self.length, workers):
            if item in self.slow and not self.gate.wait(timeout=60):
                raise TimeoutError(f"item {item} waited 60 s for its gate")
            yield item


class RecordingTransform:
    """A stream transform that appends each item it is given to the file `path` (one line
    per item, from any worker process): the items a loader really read."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, item):
        with open(self.path, "a") as file:
            file.write(f"{item}\n")
        return item


def recorded(path) -> list[int]:
    try:
        with open(path) as file:
            return [int(line) for line in file]
    except FileNotFoundError:
        return []
