"""Hugging Face `datasets` through ResumableDataLoader (issue 10 point 7, G1, G2).

Datasets are built in-process (`Dataset.from_dict`), never from the Hub.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
datasets = pytest.importorskip("datasets")

from dist_resume import ResumableDataLoader  # noqa: E402

from .process_tree import run_tree  # noqa: E402
from .s3_server import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


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


def _assert_resumes_mid_epoch(loader) -> None:
    """A state taken after 3 batches resumes on the uninterrupted run's next batch (G1)."""
    uninterrupted = _batches(loader())
    first = loader()
    head = _batches(first, 3)
    state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + _batches(resumed) == uninterrupted
    assert sorted(int(x) for batch in uninterrupted for x in batch) == list(range(40))


@pytest.mark.parametrize("make", [_torch_format, _with_transform], ids=["with_format_torch", "set_transform"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_map_style_round_trip_mid_epoch_g1(make, num_workers):
    def loader():
        return ResumableDataLoader(make(), batch_size=4, shuffle=True, seed=3, num_workers=num_workers)

    _assert_resumes_mid_epoch(loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_one_epoch_round_trip_g1(num_workers):
    def loader():
        stream = datasets.Dataset.from_dict({"x": list(range(40))}).to_iterable_dataset(num_shards=4)
        return ResumableDataLoader(stream.with_format("torch"), batch_size=4, num_workers=num_workers, snapshot_every=1)

    _assert_resumes_mid_epoch(loader)


def _stream(buffer_size: int | None, then_map: bool = False) -> datasets.IterableDataset:
    stream = datasets.Dataset.from_dict({"x": list(range(40))}).to_iterable_dataset(num_shards=4)
    if buffer_size is not None:
        stream = stream.shuffle(seed=0, buffer_size=buffer_size)
    return stream.map(lambda row: row) if then_map else stream


BUFFER_REFUSED = (
    "ResumableDataLoader: this Hugging Face IterableDataset shuffles through a buffer of 8 examples "
    "(shuffle(buffer_size=8)), which its state_dict() leaves out: a resume would lose and repeat samples. "
    "Use shuffle(seed=..., buffer_size=1), which still shuffles the shard order every epoch, or read the "
    "data files with ShardedStream(..., shuffle=True, window=...), which shuffles the items of each shard "
    "and resumes exactly"
)


@pytest.mark.parametrize("then_map", [False, True], ids=["shuffled", "shuffled_then_mapped"])
def test_a_buffered_shuffle_is_refused_before_it_can_lose_samples(then_map):
    """HF's state_dict() drops the shuffle buffer: resumed after 9 batches of 2, a stream
    shuffled with buffer_size=8 lost 5 samples and repeated 1, silently (issue 21, point 5)."""
    with pytest.raises(ValueError, match=f"^{re.escape(BUFFER_REFUSED)}$"):
        ResumableDataLoader(_stream(8, then_map), batch_size=2)


@pytest.mark.parametrize("stop", [1, 3, 9, 15])
def test_a_shard_order_shuffle_resumes_every_sample_once(stop):
    """The recipe the refusal names: buffer_size=1 shuffles the shards, and resumes exactly."""
    first = ResumableDataLoader(_stream(1), batch_size=2, snapshot_every=2)
    batches = iter(first)
    head = [int(x) for _ in range(stop) for x in next(batches)["x"]]
    resumed = ResumableDataLoader(_stream(1), batch_size=2, snapshot_every=2)
    resumed.load_state_dict(first.state_dict())
    rest = [int(x) for batch in resumed for x in batch["x"]]
    assert sorted(head + rest) == list(range(40))
    assert head + rest != list(range(40))  # shuffled


def _two_ranks(kind: str, out: Path) -> list[dict]:
    """Runs tests/hf_datasets_worker.py as a real 2-process gloo job; each rank's result."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}",
               "--master-addr=127.0.0.1", "-m", "tests.hf_datasets_worker", f"--kind={kind}", f"--out={out}"]
    # As a module from the repository root: tests/datasets.py would shadow HF datasets.
    result = run_tree(command, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return [json.loads((out / f"rank_{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_split_dataset_by_node_on_a_map_dataset_is_refused_not_sharded_twice_g2(tmp_path):
    # Before: no error, and each rank read 10 of its 20 rows (20 of 40 per epoch).
    message = (
        "the ranks hold different datasets (rows per rank: rank 0: 20, rank 1: 20): ResumableDataLoader "
        "shards the dataset over the ranks itself, so give every rank the whole dataset. A dataset split "
        "with datasets.distributed.split_dataset_by_node would be sharded twice (each rank reading 1/2 of "
        "its part); to read only each rank's own part, pass rank=0, world_size=1 (resume is then per rank, "
        "not elastic)"
    )
    assert _two_ranks("map_split", tmp_path) == [{"error": message}, {"error": message}]


@pytest.mark.slow
def test_whole_map_dataset_and_split_stream_read_every_row_once_g2(tmp_path):
    for kind in ("map_whole", "iterable_split"):
        ranks = _two_ranks(kind, tmp_path / kind)
        assert sorted(ranks[0]["values"] + ranks[1]["values"]) == list(range(40)), kind
