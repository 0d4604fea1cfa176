"""torchdata's StatefulDataLoader tutorial examples, importable by worker processes: a stateful
sampler with a noisy stateful map-style dataset, and a stateful iterable dataset split by worker."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info


class MySampler(Sampler[int]):
    """`limit` random indices below `high`, from its own generator; `i` counts them."""

    def __init__(self, high: int, seed: int, limit: int) -> None:
        self.seed, self.high, self.limit = seed, high, limit
        self.g = torch.Generator()
        self.g.manual_seed(self.seed)
        self.i = 0

    def __iter__(self):
        while self.i < self.limit:
            val = int(torch.randint(high=self.high, size=(1,), generator=self.g))
            self.i += 1
            yield val

    def __len__(self) -> int:
        return self.limit

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.i = state_dict["i"]
        self.g.set_state(state_dict["rng"])

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i, "rng": self.g.get_state()}


class NoisyRange(Dataset):
    """`idx + noise`, the noise drawn from the worker's global torch generator (its state)."""

    def __init__(self, high: int, mean: float, std: float) -> None:
        self.high, self.mean, self.std = high, torch.tensor([float(mean)]), float(std)

    def __len__(self) -> int:
        return self.high

    def __getitem__(self, idx: int) -> float:
        if not 0 <= idx < self.high:
            raise IndexError()
        return idx + torch.normal(self.mean, self.std).item()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["rng"])

    def state_dict(self) -> dict[str, Any]:
        return {"rng": torch.get_rng_state()}


class MyIterableDataset(IterableDataset):
    """A seeded permutation of `range(high)`, split by worker; `i` counts what was yielded."""

    def __init__(self, high: int, seed: int) -> None:
        self.high, self.seed = high, seed
        self.g = torch.Generator()
        self.i = 0

    def __iter__(self):
        worker_info = get_worker_info()
        worker_id, num_workers = (worker_info.id, worker_info.num_workers) if worker_info else (0, 1)
        self.g.manual_seed(self.seed)
        arr = torch.randperm(self.high, generator=self.g)[worker_id : self.high : num_workers]
        for idx in range(self.i, len(arr)):
            self.i += 1
            yield arr[idx]
        self.i = 0

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.i = state_dict["i"]


class Counting(IterableDataset):
    """`range(length)` split by worker, with no state methods (resumed by replay)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info else (0, 1)
        return iter(range(worker_id, self.length, num_workers))


class EpochCounting(IterableDataset):
    """`range(length)` split by worker, each item tagged with the pass it came from: `epoch`
    counts this object's completed passes (kept by a persistent worker's copy), `i` the
    items this pass yielded (torchdata's GeneratorIterable, in short)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.epoch = 0
        self.i = 0

    def __iter__(self):
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info else (0, 1)
        mine = range(worker_id, self.length, num_workers)
        while self.i < len(mine):
            self.i += 1
            yield mine[self.i - 1], self.epoch
        self.i = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "i": self.i}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch, self.i = state_dict["epoch"], state_dict["i"]
