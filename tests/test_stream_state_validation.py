"""G6: a damaged ShardedStream state gives one ResumeStateError naming the field; it never
silently skips or repeats items, nor fails with a raw IndexError/TypeError/KeyError
(issue 11, point 8)."""

from __future__ import annotations

import copy
import re
from typing import Any, Callable

import pytest
import torch

from dist_resume import ResumableDataLoader, ResumeStateError

from .stream_jobs import SHARD_SIZES, make_loader, make_stream, write_shards
from .tutorial_datasets import Counting

SHARDS = len(SHARD_SIZES)
ENTRY = "loader state entry 'rank_0' stream"


@pytest.fixture
def saved(tmp_path) -> tuple[Any, dict[str, Any]]:
    """A stream over the test shards and the state of a 1-rank job after two batches."""
    stream = make_stream(write_shards(str(tmp_path)))
    loader = make_loader(stream, 0, 1, 0)
    iterator = iter(loader)
    next(iterator), next(iterator)
    return stream, loader.state_dict()


def _set(name: str, value: Any) -> Callable[[dict], None]:
    def edit(stream_state: dict) -> None:
        stream_state[name] = value
    return edit


def _set_at(name: str, index: int, value: int) -> Callable[[dict], None]:
    def edit(stream_state: dict) -> None:
        stream_state[name] = stream_state[name].clone()
        stream_state[name][index] = value
    return edit


def _meta(index: int, value: int) -> Callable[[dict], None]:
    return _set_at("meta", index, value)


CASES = [
    ("consumed -3", _set_at("consumed", 3, -3), f"{ENTRY} field 'consumed' is -3 for shard 3"),
    ("finished 5", _set_at("finished", 2, 5), f"{ENTRY} field 'finished' is 5 for shard 2 (0 or 1)"),
    ("consumed too short", _set("consumed", torch.zeros(SHARDS - 1, dtype=torch.int64)),
     f"{ENTRY} field 'consumed' has {SHARDS - 1} values, expected {SHARDS}"),
    ("finished float", _set("finished", torch.zeros(SHARDS)), f"{ENTRY} field 'finished' is not a 1-D int64 tensor"),
    ("consumed list", _set("consumed", [0] * SHARDS), f"{ENTRY} field 'consumed' is not a 1-D int64 tensor"),
    ("no consumed", lambda s: s.pop("consumed"), f"{ENTRY} has no 'consumed'"),
    ("no meta", lambda s: s.pop("meta"), "loader state entry 'rank_0' has no 'stream' state"),
    ("meta too long", _set("meta", torch.zeros(5, dtype=torch.int64)), f"{ENTRY} field 'meta' has 5 values, expected 4"),
    ("unknown kind", _meta(0, 7), f"{ENTRY} field 'meta' names unknown stream kind 7"),
    ("negative workers", _meta(1, -2), f"{ENTRY} field 'meta' has num_workers -2"),
    ("last role out of range", _meta(2, 3), f"{ENTRY} field 'meta' has last role 3 of 1"),
]


@pytest.mark.parametrize("edit,message", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_damaged_stream_state_names_the_field(saved, edit, message) -> None:
    stream, state = saved
    state = copy.deepcopy(state)
    edit(state["rank_0"]["stream"])
    loader = make_loader(stream, 0, 1, 0)
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        loader.load_state_dict(state)
        next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_consumed_beyond_a_shards_items_is_refused(saved, num_workers) -> None:
    """10**6 items consumed of a 40-item shard: its items must not be silently skipped."""
    stream, state = saved
    state = copy.deepcopy(state)
    consumed = state["rank_0"]["stream"]["consumed"].clone()
    consumed[0] = 10**6
    state["rank_0"]["stream"]["consumed"] = consumed
    loader = make_loader(stream, 0, 1, num_workers)
    loader.load_state_dict(state)
    message = (f"loader state field 'consumed' says 1000000 items of shard 0 ({stream.shards[0]}) were read; "
               f"it holds {SHARD_SIZES[0]}")
    with pytest.raises(ResumeStateError, match=re.escape(message)):
        list(loader)


def test_elastic_resume_checks_every_ranks_entry(tmp_path) -> None:
    stream = make_stream(write_shards(str(tmp_path)))
    state: dict[str, Any] = {}
    for rank in range(2):
        loader = make_loader(stream, rank, 2, 0)
        next(iter(loader))
        state.update(loader.state_dict())
    consumed = state["rank_1"]["stream"]["consumed"].clone()
    consumed[4] = -1
    state["rank_1"]["stream"]["consumed"] = consumed
    message = "loader state entry 'rank_1' stream field 'consumed' is -1 for shard 4"
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        make_loader(stream, 0, 3, 0).load_state_dict(state)


@pytest.mark.parametrize("items,message", [
    (torch.tensor([-1], dtype=torch.int64), f"{ENTRY} field 'items' is -1 for role 0"),
    (torch.tensor([1, 2], dtype=torch.int64), f"{ENTRY} field 'items' has 2 values, expected 1"),
    (torch.tensor([1.0]), f"{ENTRY} field 'items' is not a 1-D int64 tensor"),
])
def test_damaged_snapshot_stream_state_names_the_field(items, message) -> None:
    """Any other IterableDataset: its per-role item counts are checked the same way."""
    loader = ResumableDataLoader(Counting(10), batch_size=2)
    next(iter(loader))
    state = copy.deepcopy(loader.state_dict())
    state["rank_0"]["stream"]["items"] = items
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        ResumableDataLoader(Counting(10), batch_size=2).load_state_dict(state)
