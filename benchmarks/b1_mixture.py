"""B1, mixture row: batches/s over an epoch of three weighted token-slice sources,
ResumableDataLoader over a Mixture vs torch's DataLoader over ConcatDataset +
WeightedRandomSampler."""

from __future__ import annotations

import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, WeightedRandomSampler

from dist_resume import Mixture, ResumableDataLoader

from .report import FigureResult
from .timing import interleaved, repetitions
from .workloads import epoch_rate

SLICE = 2048
SOURCES = {"web": 4096, "code": 2048, "books": 1024}  # slices per source
WEIGHTS = {"web": 0.6, "code": 0.3, "books": 0.1}
BATCH = 16
OURS = "ResumableDataLoader + Mixture"
OURS_UNSEEDED = "ResumableDataLoader + Mixture, deterministic_transforms=False"
TORCH = "torch DataLoader + ConcatDataset + WeightedRandomSampler"


class TokenSlices(Dataset):
    """Sample i: the i-th 2,048-token int32 slice of `tokens` from `start` on."""

    def __init__(self, tokens: torch.Tensor, start: int, count: int) -> None:
        self.tokens = tokens
        self.start = start
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> torch.Tensor:
        first = self.start + index * SLICE
        return self.tokens[first : first + SLICE]


def sources() -> dict[str, TokenSlices]:
    """Three sources cut from one large tensor of tokens."""
    tokens = torch.randint(0, 50_000, (sum(SOURCES.values()) * SLICE,), dtype=torch.int32,
                           generator=torch.Generator().manual_seed(0))
    result, start = {}, 0
    for name, count in SOURCES.items():
        result[name] = TokenSlices(tokens, start, count)
        start += count * SLICE
    return result


def torch_loader(parts: dict[str, TokenSlices], length: int, **kwargs) -> DataLoader:
    """Each sample drawn with probability weight / len(source), with replacement."""
    per_sample = torch.cat([torch.full((len(part),), WEIGHTS[name] / len(part), dtype=torch.float64)
                            for name, part in parts.items()])
    sampler = WeightedRandomSampler(per_sample, num_samples=length, replacement=True)
    return DataLoader(ConcatDataset(list(parts.values())), batch_size=BATCH, sampler=sampler, **kwargs)


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B1-mixture", "batches/s over one epoch of a 3-source token mixture (higher is better)",
                          "batches/s", log_scale=True)
    parts = sources()
    length = 4_096 if quick else 16_384
    for workers in (0, 2):
        case = f"{workers} workers"
        mix = Mixture(parts, WEIGHTS, length)
        loaders = {
            TORCH: torch_loader(parts, length, num_workers=workers),
            OURS: ResumableDataLoader(mix, batch_size=BATCH, shuffle=True, seed=0, num_workers=workers),
            OURS_UNSEEDED: ResumableDataLoader(mix, batch_size=BATCH, shuffle=True, seed=0, num_workers=workers,
                                               deterministic_transforms=False),
        }
        stats = interleaved({name: (lambda loader=loader: epoch_rate(loader)) for name, loader in loaders.items()},
                            repetitions(quick, workers))
        for name, value in stats.items():
            result.add(case, name, value)
        for name in (OURS, OURS_UNSEEDED):
            ratio = stats[name].median / stats[TORCH].median
            result.check(f"{case}: {name} vs torch", ratio, ">= 0.97", ratio >= 0.97)
    result.notes += [
        f"Sources {SOURCES} of {SLICE}-token int32 slices (views of one tensor), weights {WEIGHTS}; "
        f"{length:,} positions per epoch, batch {BATCH}.",
        "torch: per-sample weights weight/len(source), WeightedRandomSampler with replacement (i.i.d. draws, "
        "samples repeat within an epoch); Mixture: low-discrepancy composition, each source read without "
        "repetition in its own shuffled order.",
        "deterministic_transforms (the default) seeds torch, random and numpy before each sample (B6).",
    ]
    return [result]
