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
