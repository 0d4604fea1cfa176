"""Hugging Face `datasets` map-style datasets through ResumableDataLoader (issue 10 point 7, G1).

Datasets are built in-process (`Dataset.from_dict`), never from the Hub.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
datasets = pytest.importorskip("datasets")

from dist_resume import ResumableDataLoader  # noqa: E402


def _torch_format() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"x": list(range(40))}).with_format("torch")


def _add_noise(batch: dict) -> dict:
    # A random transform: G4 makes it the same for a sample wherever it is fetched.
    return {"x": [float(x) + torch.rand(()).item() for x in batch["x"]]}


def _with_transform() -> datasets.Dataset:
    data = datasets.Dataset.from_dict({"x": list(range(40))})
    data.set_transform(_add_noise)
    return data


def _batches(loader, count: int | None = None) -> list[list[float]]:
    out = []
    for batch in loader:
        out.append(torch.as_tensor(batch["x"]).tolist())
        if count is not None and len(out) == count:
            break
    return out


@pytest.mark.parametrize("make", [_torch_format, _with_transform], ids=["with_format_torch", "set_transform"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_map_style_round_trip_mid_epoch_g1(make, num_workers):
    def loader():
        return ResumableDataLoader(make(), batch_size=4, shuffle=True, seed=3, num_workers=num_workers)

    uninterrupted = _batches(loader())
    first = loader()
    head = _batches(first, 3)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + _batches(resumed) == uninterrupted
    assert sorted(int(x) for batch in uninterrupted for x in batch) == list(range(40))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_one_epoch_round_trip_g1(num_workers):
    def loader():
        stream = datasets.Dataset.from_dict({"x": list(range(40))}).to_iterable_dataset(num_shards=4)
        return ResumableDataLoader(stream.with_format("torch"), batch_size=4, num_workers=num_workers, snapshot_every=1)

    uninterrupted = _batches(loader())
    first = loader()
    head = _batches(first, 3)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + _batches(resumed) == uninterrupted
    assert sorted(int(x) for batch in uninterrupted for x in batch) == list(range(40))
