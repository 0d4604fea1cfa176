"""A crafted mixture definition in a loader state (quotas of 2**62, starts past the run, counts
that do not add up) is one ResumeStateError wherever it is read: load_state_dict and
`dist-resume inspect` (issue 24, point 5; G6, G8). Hypothesis changes one to three values."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import ResumableDataLoader
from dist_resume.mixtures.inspection import describe
from dist_resume.positions.dataset_order import DEFINITION_KEY
from dist_resume.state.fields import ResumeStateError
from dist_resume.state.saved import decode

from .mixture_datasets import mixture


def _saved_state() -> dict:
    loader = ResumableDataLoader(mixture(reweight=True), batch_size=4, shuffle=True, seed=1)
    batches = iter(loader)
    next(batches)
    return loader.state_dict()


STATE = _saved_state()
LENGTH = len(STATE[DEFINITION_KEY])
INT64 = st.integers(-(2**63), 2**63 - 1)
EDGES = st.sampled_from([-1, 0, 1, 2, 255, 256, 2**24, 2**24 + 1, 2**31, 2**62, 2**63 - 1, -(2**63)])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, LENGTH - 1), st.one_of(EDGES, INT64)), min_size=1, max_size=3))
def test_a_crafted_definition_is_one_resume_state_error(changes: list[tuple[int, int]]) -> None:
    values = STATE[DEFINITION_KEY].clone()
    for index, value in changes:
        values[index] = value
    crafted = {**STATE, DEFINITION_KEY: values}
    for read in (lambda: ResumableDataLoader(mixture(reweight=True), batch_size=4, shuffle=True, seed=1)
                 .load_state_dict(crafted),
                 lambda: describe(crafted, decode(crafted))):
        try:
            read()
        except ResumeStateError:
            pass


def test_quotas_of_2_to_62_are_refused() -> None:
    values = STATE[DEFINITION_KEY].clone()
    values[-1] = 2**62  # the last stage's last quota
    crafted = {**STATE, DEFINITION_KEY: values}
    loader = ResumableDataLoader(mixture(reweight=True), batch_size=4, shuffle=True, seed=1)
    try:
        loader.load_state_dict(crafted)
    except ResumeStateError as exc:
        assert str(exc) == "loader state's mixture definition is malformed"
    else:
        raise AssertionError("a definition with a quota of 2**62 was accepted")
    assert torch.equal(STATE[DEFINITION_KEY], _saved_state()[DEFINITION_KEY])
