"""Datasets and loaders that several figures time: the same settings for every loader compared."""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from dist_resume import ResumableDataLoader


class TinyDataset(Dataset):
    """Sample i is the int i: nothing to read or transform, so loader overhead is all there is."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


class TokenSliceDataset(Dataset):
    """Pre-tokenized text, as LLM pretraining reads it: sample i is the i-th slice of
    `sequence` tokens of one large int32 tensor. No randomness."""

    def __init__(self, length: int, sequence: int = 2048) -> None:
        self.length = length
        self.sequence = sequence
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, 50_000, (length * sequence,), dtype=torch.int32, generator=generator)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        start = index * self.sequence
        return self.tokens[start : start + self.sequence]


class AugmentedDataset(Dataset):
    """A typical image pipeline on synthetic 3x144x144 uint8 images: random crop to 128,
    random horizontal flip, float conversion and per-channel normalization, drawn from
    torch's global generator (what deterministic transforms seed)."""

    _MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    _STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)

    def __init__(self, length: int, size: int = 144, crop: int = 128) -> None:
        self.length = length
        self.crop = crop
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (16, 3, size, size), dtype=torch.uint8, generator=generator)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        image = self.images[index % len(self.images)]
        top, left = torch.randint(0, image.shape[-1] - self.crop + 1, (2,)).tolist()
        image = image[:, top : top + self.crop, left : left + self.crop]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return (image.float() / 255 - self._MEAN) / self._STD


LoaderFactory = Callable[..., DataLoader]

OURS, TORCH, TORCHDATA = "ResumableDataLoader", "torch DataLoader", "torchdata StatefulDataLoader"
# The loaders compared, each at its default settings besides the shared arguments.
LOADERS: dict[str, LoaderFactory] = {
    TORCH: DataLoader,
    OURS: lambda dataset, **kwargs: ResumableDataLoader(dataset, seed=0, **kwargs),
    TORCHDATA: StatefulDataLoader,
}


def workloads(scale: int) -> dict[str, tuple[Dataset, int]]:
    """The datasets B1 and B6 time, with their batch sizes, `scale` times the quick size."""
    return {
        "tiny": (TinyDataset(32_768 * scale), 64),
        "token-slice": (TokenSliceDataset(2_048 * scale), 16),
        "augmented": (AugmentedDataset(2_048 * scale), 32),
    }


WORKLOAD_NOTES = [
    "tiny: sample i is the int i (batch 64): pure loader overhead.",
    "token-slice: sample i is a 2,048-token slice of one large int32 tensor (batch 16): what LLM "
    "pretraining reads; no randomness.",
    "augmented: random crop 144->128, flip, normalize of a 3x144x144 uint8 image (batch 32), drawn "
    "from torch's global generator.",
]


def epoch_rate(loader: DataLoader) -> float:
    """Batches per second over one whole epoch, `iter()` (and worker start) included."""
    start = time.perf_counter()
    batches = sum(1 for _ in loader)
    return batches / (time.perf_counter() - start)


RECORD_BYTES = 8 + 256  # a tar record's data: an int64 id and 256 random bytes


def write_webdataset_shards(directory: str, sizes: list[int]) -> list[str]:
    """Tar shards of `sizes` records each, record i ``{"__key__": "<i, 9 digits>", "id": <i,
    int64 little-endian>, "bin": <256 random bytes>}``, written by webdataset's TarWriter as a
    WebDataset job writes them (a pax header before every file); their paths."""
    import webdataset

    draw = random.Random(0)
    urls, first = [], 0
    for shard, size in enumerate(sizes):
        url = f"{directory}/shard-{shard:03}.tar"
        with webdataset.TarWriter(url) as writer:
            for index in range(first, first + size):
                writer.write({"__key__": f"{index:09}", "id": struct.pack("<q", index), "bin": draw.randbytes(256)})
        urls.append(url)
        first += size
    return urls
