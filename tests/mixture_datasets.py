"""Sources for the Mixture tests (importable by worker processes)."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import Dataset

from dist_resume import Mixture

LENGTHS = {"web": 13, "code": 7, "books": 5}
STAGES = [(0, {"web": 0.5, "code": 0.3, "books": 0.2}), (50, {"web": 1, "code": 1, "books": 2})]


class Labelled(Dataset):
    """Sample i of source `label`: (label, i) and one draw of each generator G4 seeds."""

    def __init__(self, label: int, length: int) -> None:
        self.label = label
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict:
        return {"source": self.label, "index": index, "torch": torch.rand(()).item(),
                "random": random.random(), "numpy": float(np.random.rand())}


def mixture(weights=STAGES, length: int = 60, lengths: dict[str, int] = LENGTHS, reweight: bool = False) -> Mixture:
    sources = {name: Labelled(label, size) for label, (name, size) in enumerate(lengths.items())}
    return Mixture(sources, weights, length, reweight=reweight)


def samples(batch: dict) -> list[tuple]:
    """(source, index, torch, random, numpy) per sample of a collated batch."""
    return list(zip(*(batch[key].tolist() for key in ("source", "index", "torch", "random", "numpy"))))
