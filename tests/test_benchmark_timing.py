"""The order in which side-by-side benchmarks take their cases (benchmarks/timing.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.timing import balanced_rounds, rotated


def _neighbours(rounds: list[list[str]]) -> Counter:
    """Every (case, the case run right after it), the rounds read one after another and the
    last one followed by the first again."""
    sequence = [name for round_ in rounds for name in round_]
    return Counter(zip(sequence, sequence[1:] + sequence[:1]))


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_every_case_follows_every_case_equally_often(count: int) -> None:
    names = ["managed", "unseeded", "sampler", "sampler-again"][:count]
    rounds = balanced_rounds(names)
    assert all(sorted(round_) == sorted(names) for round_ in rounds)
    assert len(rounds) in (count, 2 * count)
    neighbours = _neighbours(rounds)
    assert set(neighbours) == {(first, then) for first in names for then in names}
    assert len(set(neighbours.values())) == 1


@pytest.mark.parametrize("count", [1, 2, 3, 4])
def test_every_case_takes_every_place_in_a_round_equally_often(count: int) -> None:
    names = ["managed", "unseeded", "sampler", "sampler-again"][:count]
    rounds = balanced_rounds(names)
    places = Counter((name, place) for round_ in rounds for place, name in enumerate(round_))
    assert set(places) == {(name, place) for name in names for place in range(count)}
    assert set(places.values()) == {len(rounds) // count}


def test_the_four_loaders_of_b11_need_a_cycle_of_eight_rounds() -> None:
    assert balanced_rounds(list("MUSA")) == [list("MUSA"), list("AMUS"), list("SMAU"), list("UAMS"),
                                             list("SUMA"), list("ASUM"), list("MSAU"), list("UASM")]


def test_rotated_rounds_do_not_balance_what_follows_what() -> None:
    """What B11 ran until 2026-11-29: within a round, a loader always followed the same one."""
    neighbours = _neighbours([rotated(list("MUSA"), round_) for round_ in range(4)])
    assert neighbours[("M", "U")] == 3 and neighbours[("U", "M")] == 0


def test_more_cases_than_searched_for_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^balanced orders are searched for up to 4 cases, got 5$"):
        balanced_rounds(list("ABCDE"))
