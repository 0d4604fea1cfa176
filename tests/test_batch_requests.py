"""The wire form of a batch request (what a worker receives) carries the same request."""

from __future__ import annotations

import pickle

from hypothesis import given
from hypothesis import strategies as st

from dist_resume.loader.fetch import BatchRequest

_positions = st.one_of(
    st.builds(lambda start, size: range(start, start + size), st.integers(0, 2**40), st.integers(0, 70)),
    st.lists(st.integers(0, 2**40), max_size=70),
)


@st.composite
def _requests(draw: st.DrawFn) -> BatchRequest:
    positions = draw(_positions)
    keys = st.one_of(st.integers(0, 2**40), st.tuples(st.integers(0, 5), st.integers(0, 2**40)))
    indices = draw(st.lists(keys, min_size=len(positions), max_size=len(positions)))
    role = draw(st.integers(0, 7))
    restore = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.integers())))
    return BatchRequest(draw(st.integers(0, 2**20)), positions, indices, role, restore)


@given(_requests())
def test_a_request_survives_its_wire_form_through_pickle(request: BatchRequest) -> None:
    wire = request.wire()
    received = BatchRequest.unwire(pickle.loads(pickle.dumps(wire)))
    assert received == request
    assert list(received.positions) == list(request.positions)


def test_the_wire_form_holds_builtins_only() -> None:
    request = BatchRequest(3, range(64, 80), list(range(16)))
    assert request.wire() == (3, 64, list(range(16)))
    assert b"dist_resume" not in pickle.dumps(request.wire())
    assert b"range" not in pickle.dumps(request.wire())
