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

from .stream_jobs import SHARD_SIZES, make_loader, make_stream, run_job, write_shards
from .tutorial_datasets import Counting

ENTRY = "loader state entry 'rank_0' stream"
READER_DIGEST = make_stream([]).reader_digest


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


def _canonical(index: int, value: int) -> Callable[[dict], None]:
    return _set_at("canonical", index, value)


CASES = [
    ("position -3", _canonical(2, -3), f"{ENTRY} field 'canonical' has epoch position -3"),
    ("canonical streams 0", _canonical(0, 0), f"{ENTRY} field 'canonical' has canonical_streams 0"),
    ("global batch 0", _canonical(1, 0), f"{ENTRY} field 'canonical' has global batch 0"),
    ("canonical too short", _set("canonical", torch.zeros(4, dtype=torch.int64)),
     f"{ENTRY} field 'canonical' has 4 values, expected 5"),
    ("canonical float", _set("canonical", torch.zeros(5)), f"{ENTRY} field 'canonical' is not a 1-D int64 tensor"),
    ("canonical list", _set("canonical", [1] * 5), f"{ENTRY} field 'canonical' is not a 1-D int64 tensor"),
    ("no canonical", lambda s: s.pop("canonical"), f"{ENTRY} has no 'canonical'"),
    ("other reader", _canonical(4, 12345),
     f"{ENTRY} field 'canonical' was saved with another reader (digest 12345); this ShardedStream's reader has "
     f"digest {READER_DIGEST}"),
    ("other lengths", _canonical(3, 12345),
     f"{ENTRY} field 'canonical' was saved for shards of other item counts: a shard changed since, or lengths= "
     "differs from the counts the state was saved with"),
    ("position past the epoch", _canonical(2, 1000),
     f"{ENTRY} field 'canonical' says epoch position 1000 of an epoch of {sum(SHARD_SIZES)} items"),
    ("no meta", lambda s: s.pop("meta"), "loader state entry 'rank_0' has no 'stream' state"),
    ("meta too long", _set("meta", torch.zeros(5, dtype=torch.int64)), f"{ENTRY} field 'meta' has 5 values, expected 4"),
    ("unknown kind", _meta(0, 7), f"{ENTRY} field 'meta' names unknown stream kind 7"),
    ("negative workers", _meta(1, -2), f"{ENTRY} field 'meta' has num_workers -2"),
    ("last role out of range", _meta(2, 3), f"{ENTRY} field 'meta' has last role 3 of 1"),
    ("per-shard format", _meta(0, 1),
     f"{ENTRY} field 'meta' holds a ShardedStream state of the per-shard format (fields 'consumed' and 'finished', "
     "from dist_resume before canonical streams), which this version cannot continue exactly: finish that epoch "
     "with the version that saved it, or start the epoch afresh"),
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


def test_elastic_resume_checks_every_ranks_entry(tmp_path) -> None:
    stream = make_stream(write_shards(str(tmp_path)))
    _, state = run_job(stream, 2, 0, None, 1)
    canonical = state["rank_1"]["stream"]["canonical"].clone()
    canonical[2] = -1
    state["rank_1"]["stream"]["canonical"] = canonical
    message = "loader state entry 'rank_1' stream field 'canonical' has epoch position -1"
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
