"""Every number a loader saves is an int64 (G5, issue 33): a caller's argument is bounded where
it comes in (`dist_resume.arguments`, the loader's constructor), a loaded state's in
`state/saved.py`, and an epoch's end never counts past 2**63 - 1. Out of range is one
ValueError or ResumeStateError at the call, never a raw "Overflow when unpacking long long"
from a later `state_dict()`."""

from __future__ import annotations

import re
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import Mixture, ResumableDataLoader, ResumeStateError
from dist_resume.state.fields import FIELDS, MAX_WORLD_SIZE, PROGRESS_KEY, RankState

from tests.merged_states import merged

LAST_EPOCH = 2**63 - 1
NO_NEXT_EPOCH = (f"epoch {LAST_EPOCH} is the last one a loader serves (epochs are saved as int64); set_epoch() an "
                 "earlier one")


def _loader(**options) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(8)), batch_size=4, **options)


def test_the_last_epoch_ends_and_is_saved_and_there_is_no_next() -> None:
    loader = _loader()
    loader.set_epoch(LAST_EPOCH)
    assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    state = loader.state_dict()  # raised "Overflow when unpacking long long"
    saved = RankState.from_tensor(state["rank_0"][PROGRESS_KEY], "rank_0")
    assert (saved.epoch, saved.epoch_finished, saved.batches_consumed) == (LAST_EPOCH, 1, 2)
    resumed = _loader()
    resumed.load_state_dict(state)
    assert resumed.epoch == LAST_EPOCH and list(resumed) == []  # a finished epoch's pass yields no batch
    for stopped in (loader, resumed):
        assert stopped.epoch == LAST_EPOCH
        with pytest.raises(ValueError, match=f"^{re.escape(NO_NEXT_EPOCH)}$"):
            iter(stopped)


def test_the_epoch_before_the_last_runs_into_the_last_one() -> None:
    loader = _loader()
    loader.set_epoch(LAST_EPOCH - 1)
    for _ in range(2):
        assert len(list(loader)) == 2
    assert loader.state_dict()["rank_0"][PROGRESS_KEY][FIELDS.index("epoch")] == LAST_EPOCH
    with pytest.raises(ValueError, match=f"^{re.escape(NO_NEXT_EPOCH)}$"):
        iter(loader)


def _at_global_step(step: int) -> dict:
    loaders = [ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=3, rank=rank, world_size=2)
               for rank in range(2)]
    for loader in loaders:
        next(iter(loader))
    states = [loader.state_dict() for loader in loaders]
    for rank, state in enumerate(states):
        progress = state[f"rank_{rank}"][PROGRESS_KEY].clone()
        progress[FIELDS.index("global_step")] = step
        state[f"rank_{rank}"] = {**state[f"rank_{rank}"], PROGRESS_KEY: progress}
    return merged(*states)


@pytest.mark.parametrize("step", [2**63 - 1, 2**62 + 1])
def test_a_loaded_global_step_leaves_room_to_count_on(step: int) -> None:
    for rank in range(2):
        with pytest.raises(ResumeStateError, match=re.escape(
                f"loader state of rank 0 is impossible: global step {step} outside -1 to 2**62")):
            ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=3, rank=rank,
                                world_size=2).load_state_dict(_at_global_step(step))
    loader = ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=3, rank=0, world_size=2)
    loader.load_state_dict(_at_global_step(2**62))
    next(iter(loader))
    assert loader.state_dict()["rank_0"][PROGRESS_KEY][FIELDS.index("global_step")] == 2**62 + 1


@pytest.mark.parametrize("build, message", [
    (lambda: _loader(rank=0, world_size=2**70), f"world_size must be in [1, {MAX_WORLD_SIZE + 1}), got {2**70}"),
    (lambda: _loader(rank=2**70, world_size=2**71), f"world_size must be in [1, {MAX_WORLD_SIZE + 1}), got {2**71}"),
    (lambda: _loader(rank=0, world_size=MAX_WORLD_SIZE + 1),
     f"world_size must be in [1, {MAX_WORLD_SIZE + 1}), got {MAX_WORLD_SIZE + 1}"),
    (lambda: ResumableDataLoader(list(range(8)), batch_size=2**62, rank=0, world_size=4),
     f"batch_size {2**62} x world_size 4, the global batch, is saved as int64: it must be below 2**63"),
    (lambda: Mixture({"a": [1, 2], "b": [3]}, [(0, {"a": 1, "b": 1}), (2**70, {"a": 1, "b": 2})]),
     f"mixture stage start must be in [0, {2**38}), got {2**70}"),
    (lambda: Mixture({"a": [1, 2], "b": [3]}, {"a": 1, "b": 1}, length=2**63 - 1),
     f"Mixture length (positions per epoch) must be in [1, {2**62 + 1}), got {2**63 - 1}"),
])
def test_an_argument_that_would_not_fit_its_int64_is_refused_where_it_comes_in(build, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build()


def test_a_field_out_of_int64_is_named_not_a_raw_overflow() -> None:
    state = RankState.from_tensor(_loader().state_dict()["rank_0"][PROGRESS_KEY], "rank_0")
    import dataclasses

    with pytest.raises(ValueError, match=re.escape(f"loader state field epoch = {2**63} does not fit the int64 "
                                                   "it is saved as")):
        dataclasses.replace(state, epoch=2**63).to_tensor()


@settings(max_examples=150, deadline=None)
@given(world_size=st.integers(1, 2**70), rank=st.integers(0, 2**70), batch_size=st.integers(1, 2**70),
       epoch=st.integers(0, 2**64), skipped=st.integers(0, 2**70), batches=st.integers(0, 3))
def test_any_arguments_are_refused_at_the_call_or_saved(world_size: int, rank: int, batch_size: int, epoch: int,
                                                        skipped: int, batches: int) -> None:
    """Over the arguments' whole range: each call either refuses its argument with one
    ValueError, or the loader's state_dict() afterwards holds every number as an int64."""
    try:
        loader = ResumableDataLoader(list(range(40)), batch_size=batch_size, rank=rank % world_size,
                                     world_size=world_size)
        loader.set_epoch(epoch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loader.skip(skipped % 100)
        for _ in range(batches):
            for _ in loader:
                pass
    except ValueError as exc:
        assert "Overflow" not in str(exc) and "too large" not in str(exc)
        return
    state = loader.state_dict()
    assert RankState.from_tensor(state[f"rank_{loader.rank}"][PROGRESS_KEY], "entry").world_size == world_size
