"""Integers and floats of any numeric type (numpy scalars, torch 0-d tensors) are taken
wherever torch's DataLoader and samplers take them, and mean exactly what the Python number
means; out-of-range values are refused by the call that receives them (issue 24 point 7)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dist_resume import Mixture, ResumableDataLoader
from dist_resume.streams import ShardedStream

from .datasets import Squares
from .mixture_datasets import Labelled
from .stream_jobs import read_jsonl, write_shards
from .test_loader import assert_same_batches

INTEGERS = {"numpy_int64": np.int64, "numpy_uint32": np.uint32, "torch_0d": torch.tensor}


def _epochs(loader: ResumableDataLoader, epochs: int = 2) -> list[Any]:
    return [batch for _ in range(epochs) for batch in loader]


@pytest.mark.parametrize("kind", INTEGERS)
def test_a_numeric_seed_epoch_rank_and_world_size_mean_their_value(kind: str) -> None:
    as_kind = INTEGERS[kind]
    loader = ResumableDataLoader(Squares(20), batch_size=3, shuffle=True, seed=as_kind(5),
                                 rank=as_kind(1), world_size=as_kind(2))
    plain = ResumableDataLoader(Squares(20), batch_size=3, shuffle=True, seed=5, rank=1, world_size=2)
    loader.set_epoch(as_kind(2))
    plain.set_epoch(2)
    assert_same_batches(_epochs(loader), _epochs(plain))
    assert (type(loader.seed), type(loader.rank), type(loader.world_size), type(loader.epoch)) == (int,) * 4
    assert loader.state_dict()["rank_1"]["progress"].tolist() == plain.state_dict()["rank_1"]["progress"].tolist()


@pytest.mark.parametrize("kind", INTEGERS)
def test_a_numeric_stream_seed_means_its_value(tmp_path, kind: str) -> None:
    urls = write_shards(str(tmp_path))
    stream = ShardedStream(urls, read_jsonl, window=8, seed=INTEGERS[kind](1))
    plain = ShardedStream(urls, read_jsonl, window=8, seed=1)
    assert type(stream.seed) is int
    stream.set_epoch(INTEGERS[kind](2))  # as a plain DataLoader's loop calls it
    plain.set_epoch(2)
    assert_same_batches(DataLoader(stream, batch_size=4), DataLoader(plain, batch_size=4))
    assert_same_batches(_epochs(ResumableDataLoader(stream, batch_size=4)),
                        _epochs(ResumableDataLoader(plain, batch_size=4)))


FLOATS = {"numpy_float32": np.float32, "numpy_float64": np.float64, "numpy_int64": np.int64,
          "torch_0d": torch.tensor}


@pytest.mark.parametrize("kind", FLOATS)
def test_numeric_mixture_weights_mean_their_value(kind: str) -> None:
    as_kind = FLOATS[kind]
    sources = {"a": Labelled(0, 5), "b": Labelled(1, 7)}
    weights = {"a": 0.25, "b": 3.0} if kind != "numpy_int64" else {"a": 1, "b": 12}
    mix = Mixture(sources, {name: as_kind(weight) for name, weight in weights.items()}, length=30)
    assert mix.schedule == Mixture(sources, weights, length=30).schedule
    assert mix.definition.stages[0].quotas == (1, 12)
    plain = Mixture(sources, weights, length=30)
    assert mix.keys(range(60), seed=np.int64(3), shuffle=True) == plain.keys(range(60), seed=3, shuffle=True)
    assert mix.progress(torch.tensor(45)) == plain.progress(45)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda loader: loader.set_epoch(2**63), ValueError, "epoch must be in [0, 2**63), got 9223372036854775808"),
        (lambda loader: loader.set_epoch(np.uint64(2**63)), ValueError,
         "epoch must be in [0, 2**63), got 9223372036854775808"),
        (lambda loader: loader.set_epoch(-1), ValueError, "epoch must be in [0, 2**63), got -1"),
        (lambda loader: loader.set_epoch(1.5), TypeError, "epoch must be an int, got float 1.5"),
        (lambda loader: loader.set_epoch(np.float64(2.0)), TypeError, "epoch must be an int, got float64 np.float64(2.0)"),
        (lambda loader: loader.set_epoch(torch.tensor([2])), TypeError,
         "epoch must be an int, got Tensor tensor([2])"),
        (lambda loader: loader.set_epoch(torch.tensor(True)), TypeError,
         "epoch must be an int, got Tensor tensor(True)"),
        (lambda loader: ResumableDataLoader(Squares(4), seed=np.uint64(2**63)), ValueError,
         "seed must be in [0, 2**63), got 9223372036854775808"),
        (lambda loader: ResumableDataLoader(Squares(4), seed=True), TypeError, "seed must be an int, got bool True"),
        (lambda loader: ResumableDataLoader(Squares(4), seed=5.0), TypeError, "seed must be an int, got float 5.0"),
        (lambda loader: ShardedStream(["a.jsonl"], read_jsonl, seed=np.int64(-1)), ValueError,
         "seed must be in [0, 2**63), got -1"),
        (lambda loader: Mixture({"a": Labelled(0, 5)}, {"a": torch.tensor(True)}, length=5), ValueError,
         "mixture weights must be finite numbers >= 0, got tensor(True)"),
        (lambda loader: Mixture({"a": Labelled(0, 5)}, {"a": np.float32("nan")}, length=5), ValueError,
         "mixture weights must be finite numbers >= 0, got np.float32(nan)"),
    ],
    ids=["epoch_2**63", "epoch_uint64", "epoch_negative", "epoch_float", "epoch_numpy_float", "epoch_1d_tensor",
         "epoch_bool_tensor", "seed_2**63", "seed_bool", "seed_float", "stream_seed_negative", "weight_bool_tensor",
         "weight_nan"],
)
def test_out_of_range_or_non_integer_values_are_refused_by_the_call(call, error, message) -> None:
    loader = ResumableDataLoader(Squares(8), batch_size=2)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call(loader)
    assert loader.epoch == 0  # the loader still serves and saves as before
    assert len(list(loader)) == 4 and loader.state_dict()["rank_0"]["progress"].tolist()
