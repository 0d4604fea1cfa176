"""Paired ratios of loaders timed side by side in rounds, and how far their median can be
trusted: a bootstrap interval over the launches of the job and their rounds."""

from __future__ import annotations

import operator
import random
import statistics
from collections.abc import Callable


def per_round(combine: Callable[..., float], *series: list[list[float]]) -> list[list[float]]:
    """Per round, `combine` of the series' values of each group (`series[s][g][r]`: series s,
    group g, round r): the values measured side by side."""
    groups = min(len(values) for values in series)
    rounds = min(len(group) for values in series for group in values)
    return [[combine(*(values[group][round_] for values in series)) for group in range(groups)]
            for round_ in range(rounds)]


def ratio_pairs(ours: list[list[float]], theirs: list[list[float]]) -> list[list[float]]:
    """Per round, the ratios of `ours` to `theirs` in each group (`ours[g][r]`: group g's
    value in round r)."""
    return per_round(operator.truediv, ours, theirs)


def median_interval(launches: list[list[list[float]]], level: float = 0.9, resamples: int = 2000,
                    seed: int = 0) -> tuple[float, float, float]:
    """The median of every ratio of every launch's rounds (`launches[l][r]`: the ratios of
    round r of launch l, one per group), and its `level` bootstrap interval: launches drawn
    with replacement, then each drawn launch's rounds, each round with all its ratios (the
    groups of a round share its load, the rounds of a launch its processes: their memory
    layout, their threads' cores)."""
    median = statistics.median(ratio for rounds in launches for round_ in rounds for ratio in round_)
    draw = random.Random(seed)
    medians = sorted(
        statistics.median(ratio for rounds in draw.choices(launches, k=len(launches))
                          for round_ in draw.choices(rounds, k=len(rounds)) for ratio in round_)
        for _ in range(resamples))
    tail = (1 - level) / 2
    return median, medians[int(tail * resamples)], medians[min(resamples - 1, int((1 - tail) * resamples))]
