"""Interleaved repetitions and their summary (median and spread)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class Stats:
    """Median of repeated measurements, with their minimum and maximum."""

    median: float
    low: float
    high: float
    reps: int

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        return cls(statistics.median(values), min(values), max(values), len(values))

    @classmethod
    def exact(cls, value: float) -> Stats:
        """A value that is counted, not timed (no spread)."""
        return cls(value, value, value, 1)


def repetitions(quick: bool, workers: int) -> int:
    """Interleaved repetitions of one epoch-timing case. With workers, three processes share
    the machine's cores and an epoch moves by about 10% with their scheduling: twice as many
    repetitions bring the median's spread down to a few percent."""
    if quick:
        return 3
    return 15 if workers else 7


def seconds(fn: Callable[[], object]) -> float:
    """Wall time of one call of `fn`."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rotated(names: list[Key], rep: int) -> list[Key]:
    """`names` in the order of repetition `rep`: each one first in turn."""
    shift = rep % len(names)
    return names[shift:] + names[:shift]


_MOST_BALANCED = 4  # the search below takes about a second at 4 (B11 orders four loaders)


def balanced_rounds(names: list[Key]) -> list[list[Key]]:
    """One order of `names` per round, to be run one round after another and then again from
    the first: over each such cycle, every name directly follows every name (itself only from
    one round to the next) equally often, so that what a case inherits from the case before
    it falls on all alike, and every name takes every place in a round equally often, so that
    what changes within a round falls on all alike too. `rotated` does not give that: its
    rounds keep one cyclic order, in which a name always follows the same one within a round."""
    if len(names) > _MOST_BALANCED:
        raise ValueError(f"balanced orders are searched for up to {_MOST_BALANCED} cases, got {len(names)}")
    for times in (1, 2):
        found = _balanced_permutations(len(names), times)
        if found is not None:
            return [[names[index] for index in round_] for round_ in found]
    raise AssertionError(f"no balanced order of {len(names)} cases")  # 2n rounds exist up to _MOST_BALANCED


def _balanced_permutations(count: int, times: int) -> list[list[int]] | None:
    """`times * count` permutations of `range(count)` in which, read as one sequence that wraps
    around, every ordered pair of neighbours occurs `times` times, and every number takes
    every place of a permutation `times` times; None if there is none."""
    length = times * count * count
    pairs = {(first, then): 0 for first in range(count) for then in range(count)}
    places = {(number, place): 0 for number in range(count) for place in range(count)}
    sequence: list[int] = []

    def extend() -> bool:
        if len(sequence) == length:
            return pairs[sequence[-1], sequence[0]] < times
        place = len(sequence) % count
        round_ = sequence[len(sequence) - place:]
        for then in range(count):
            pair = (sequence[-1], then) if sequence else None
            if then in round_ or (pair is not None and pairs[pair] == times) or places[then, place] == times:
                continue
            if pair is not None:
                pairs[pair] += 1
            places[then, place] += 1
            sequence.append(then)
            if extend():
                return True
            sequence.pop()
            places[then, place] -= 1
            if pair is not None:
                pairs[pair] -= 1
        return False

    if not extend():
        return None
    return [sequence[start:start + count] for start in range(0, length, count)]


def interleaved(cases: Mapping[Key, Callable[[], float]], reps: int, warmup: int = 1) -> dict[Key, Stats]:
    """Run every case once per repetition, in a rotated order, so that load that drifts
    over the run hits all cases alike. A case returns its own measurement (e.g. seconds);
    the first `warmup` repetitions are dropped."""
    names = list(cases)
    values: dict[Key, list[float]] = {name: [] for name in names}
    for rep in range(warmup + reps):
        for name in rotated(names, rep):
            value = cases[name]()
            if rep >= warmup:
                values[name].append(value)
    return {name: Stats.of(found) for name, found in values.items()}
