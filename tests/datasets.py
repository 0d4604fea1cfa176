"""Small map-style datasets shared by the loader tests (importable by worker processes)."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import Dataset


class Squares(Dataset):
    """Deterministic samples: (index, index**2) as a tuple, or a dict."""

    def __init__(self, length: int, as_dict: bool = False) -> None:
        self.length = length
        self.as_dict = as_dict

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if self.as_dict:
            return {"index": index, "square": torch.tensor([index * index])}
        return index, torch.tensor([index * index])


class Augmented(Dataset):
    """A sample plus random augmentation from all three generators G4 seeds."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return {
            "index": index,
            "torch": torch.rand(()).item(),
            "random": random.random(),
            "numpy": float(np.random.rand()),
        }


class Fetches(Dataset):
    """Records which indices were fetched (single-process loaders only)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        self.fetched.append(index)
        return index


class BatchedFetch(Dataset):
    """Defines __getitems__: fetches a whole batch in one call, with one random draw per call."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        raise AssertionError("the loader must use __getitems__")

    def __getitems__(self, indices: list[int]) -> list[tuple[int, float]]:
        noise = random.random()
        return [(index, noise) for index in indices]


def flatten(batches) -> list[int]:
    """Dataset indices of batches of `(indices, ...)` tuples or `{"index": ...}` dicts."""
    result = []
    for batch in batches:
        indices = batch["index"] if isinstance(batch, dict) else batch[0]
        result += indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
    return result


class Indices(Dataset):
    """A sample is its own index: what was consumed is what was yielded."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


class DrawsLate(Dataset):
    """Draws nothing for indices below `start`, then one value from `random` (G4 must hold
    though the loader only learns it midway)."""

    def __init__(self, length: int, start: int) -> None:
        self.length = length
        self.start = start

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        return index, (random.random() if index >= self.start else -1.0)


class OwnGenerator(Dataset):
    """Augments with the sample's own generator (`dist_resume.sample_generator()`)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        from dist_resume import sample_generator

        return index, torch.rand((), generator=sample_generator()).item(), torch.rand((), generator=sample_generator()).item()
