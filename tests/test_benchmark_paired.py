"""The paired ratios of B11 and the bootstrap interval of their median (benchmarks/paired.py)."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.paired import median_interval, ratio_pairs


def test_each_round_pairs_every_group_s_values_of_that_round() -> None:
    ours = [[2.0, 3.0, 4.0], [5.0, 6.0]]
    theirs = [[1.0, 2.0, 8.0], [10.0, 4.0, 1.0]]
    assert ratio_pairs(ours, theirs) == [[2.0, 0.5], [1.5, 1.5]]


rounds = st.lists(st.lists(st.floats(0.5, 2.0), min_size=1, max_size=3), min_size=1, max_size=12)


@given(rounds)
def test_the_median_is_of_all_ratios_and_its_interval_stays_within_them(drawn: list[list[float]]) -> None:
    median, low, high = median_interval([drawn], resamples=200)
    ratios = [ratio for round_ in drawn for ratio in round_]
    assert median == statistics.median(ratios)
    assert min(ratios) <= low <= high <= max(ratios)


def test_rounds_that_all_agree_leave_no_doubt() -> None:
    assert median_interval([[[1.01, 1.01]] * 30] * 2) == (1.01, 1.01, 1.01)


def test_the_interval_narrows_as_rounds_of_the_same_spread_accumulate() -> None:
    spread = [[0.9, 1.1], [1.0, 1.2], [0.95, 1.05]]
    _, low, high = median_interval([spread * 2])
    _, more_low, more_high = median_interval([spread * 40])
    assert more_high - more_low < high - low


def test_launches_that_disagree_widen_the_interval_their_rounds_alone_would_give() -> None:
    """Rounds agree within each launch of the job and launches differ (each its processes'
    memory layout and cores): the interval spans the launches, where the same rounds read
    as one launch would claim the middle one's ratio for certain."""
    launches = [[[1.0, 1.0]] * 20, [[1.02, 1.02]] * 20, [[1.04, 1.04]] * 20]
    assert median_interval([[round_ for rounds in launches for round_ in rounds]]) == (1.02, 1.02, 1.02)
    assert median_interval(launches) == (1.02, 1.0, 1.04)
