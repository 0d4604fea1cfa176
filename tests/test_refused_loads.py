"""A refused `load_state_dict` changes nothing (G6, issue 24 point 3): the loader's seed,
epoch, position and plan, a reweighting Mixture's schedule and a stream's records are as
before, and the loader serves exactly the batches it would have served."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from dist_resume import ResumableDataLoader, ResumeStateError
from dist_resume.state.fields import FIELDS
from dist_resume.streams.cursor import STREAM_KEY

from .datasets import Squares
from .mixture_datasets import mixture
from .test_loader import assert_same_batches
from .tutorial_datasets import MyIterableDataset

OTHER_WEIGHTS = [(0, {"web": 1, "code": 1, "books": 1})]


def _flat(state: Any) -> Any:
    """A state dict with its tensors as lists, comparable with ==."""
    if isinstance(state, dict):
        return {key: _flat(value) for key, value in state.items()}
    return state.tolist() if isinstance(state, torch.Tensor) else state


def _edited(state: dict, **fields: int) -> dict:
    for field, value in fields.items():
        state["rank_0"]["progress"][FIELDS.index(field)] = value
    return state


def _saved(make: Callable[[], ResumableDataLoader], batches: int = 1) -> dict:
    loader = make()
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    return loader.state_dict()


def _unseeded_squares() -> ResumableDataLoader:
    torch.manual_seed(0)  # the default seed is drawn from torch's generator
    return ResumableDataLoader(Squares(20), batch_size=4, shuffle=True)


def _reweighting_mixture() -> ResumableDataLoader:
    torch.manual_seed(0)
    return ResumableDataLoader(mixture(reweight=True), batch_size=4, shuffle=True)


def _unseeded_stream() -> ResumableDataLoader:
    torch.manual_seed(0)
    return ResumableDataLoader(MyIterableDataset(13, 0), batch_size=2)


def _stream_with_negative_items() -> dict:
    state = _saved(lambda: ResumableDataLoader(MyIterableDataset(13, 0), batch_size=2, seed=99))
    state["rank_0"][STREAM_KEY]["items"][0] = -1
    return state


CASES = {
    # an unseeded loader adopted the state's seed, then refused the state's dataset length
    "seed": (_unseeded_squares,
             lambda: _saved(lambda: ResumableDataLoader(Squares(21), batch_size=4, shuffle=True, seed=99)),
             "loader state was saved for a dataset of 21 samples; this loader's dataset has 20"),
    # reweight=True adopted the saved weights, then the progress was found impossible
    "schedule": (_reweighting_mixture,
                 lambda: _edited(_saved(lambda: ResumableDataLoader(mixture(OTHER_WEIGHTS), batch_size=4,
                                                                    shuffle=True, seed=99)),
                                 batches_consumed=2, samples_consumed=8, epoch_finished=1),
                 "loader state of rank 0 is impossible: its epoch is finished after 2 of 15 batches"),
    # the stream's records were reset, then its items were refused
    "stream": (_unseeded_stream, _stream_with_negative_items,
               "loader state entry 'rank_0' stream field 'items' is -1 for role 0"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("during_iteration", [False, True], ids=["between", "during"])
def test_a_refused_load_changes_nothing(case: str, during_iteration: bool) -> None:
    make, refused, message = CASES[case]
    state = refused()
    loader, twin = make(), make()
    served = [iter(loader), iter(twin)]
    assert_same_batches([next(served[0]), next(served[0])], [next(served[1]), next(served[1])])
    if not during_iteration:
        served = [iter(loader), iter(twin)]  # the next pass: the rest of epoch 0
    before = (loader.seed, _flat(loader.state_dict()), getattr(loader.dataset, "schedule", None))
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        loader.load_state_dict(state)
    assert (loader.seed, _flat(loader.state_dict()), getattr(loader.dataset, "schedule", None)) == before
    assert_same_batches(list(served[0]), list(served[1]))
    assert_same_batches(list(loader), list(twin))  # and the next epoch
    assert _flat(loader.state_dict()) == _flat(twin.state_dict())
