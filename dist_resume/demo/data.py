"""The demo's synthetic dataset and model: small, deterministic, with a random augmentation."""

from __future__ import annotations

import random

import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES = 8
CLASSES = 2


class SyntheticDataset(Dataset):
    """Sample ``i``: ``(features, label, i)``. Features and label depend only on ``i``; the
    augmentation (noise and scale) draws from the global ``torch`` and ``random`` generators,
    which ResumableDataLoader seeds per sample from (seed, epoch, position) (G4)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"dataset size must be >= 1, got {size}")
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        if not 0 <= index < self.size:
            raise IndexError(f"index {index} outside a dataset of {self.size} samples")
        clean = torch.randn(FEATURES, generator=torch.Generator().manual_seed(index))
        label = torch.tensor(int(clean[: FEATURES // 2].sum() > clean[FEATURES // 2 :].sum()))
        augmented = (clean + 0.1 * torch.randn(FEATURES)) * random.uniform(0.9, 1.1)
        return augmented, label, index


def make_model() -> nn.Module:
    """A two-layer classifier for SyntheticDataset."""
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))
