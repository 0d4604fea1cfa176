"""Per-item randomness of a stream (G4): the global generators that a stream's per-item
user code sees (its `transform`, a Mixture's map-style draws, its reader) are seeded from
the item's seed, and the caller gets its generator states back after each batch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dist_resume.randomness.global_generators import NAMES, Generator, generators
from dist_resume.randomness.per_sample import CONTEXT
from dist_resume.randomness.seeds import derive_seed


class ItemSeeding:
    """Seeds the generators `choice` names (`deterministic_transforms`: True for all of
    `torch`, `random`, `numpy`, or a set of those names) before each item; `seed` is the
    loader's seed, from which every item's seed is derived.

    Unlike a map-style fetch, a stream's item cannot be read again, so the generators are
    not learnt by fetching twice: every chosen one is seeded before every item. The states
    the caller's generators had before the first seeding of a batch come back at `restore()`.
    """

    def __init__(self, seed: int, choice: bool | Iterable[str], shared: _Shared | None = None) -> None:
        self.seed = seed
        self._names = tuple(NAMES) if choice is True else tuple(name for name in NAMES if name in choice)
        self._shared = shared or _Shared()  # `derived` seedings share it: one caller state to restore

    def derived(self, *parts: int) -> ItemSeeding:
        """The same seeding, its items' seeds derived from `(seed, *parts)` instead."""
        return ItemSeeding(derive_seed(self.seed, *parts), self._names, self._shared)

    def each(self, fn: Callable[[Any], Any], values: Sequence[Any], seeds: Sequence[int]) -> list[Any]:
        """`fn(value)` for each value, under its seed (also `sample_seed()` inside `fn`)."""
        context = CONTEXT
        outer = context.seed
        results = []
        try:
            for seed, value in zip(seeds, values):
                self.block(seed)
                context.seed, context.generator_seed = seed, None
                results.append(fn(value))
        finally:
            context.seed = outer
        return results

    def block(self, seed: int) -> None:
        """Seed the chosen generators with `seed`, the caller's states kept first."""
        shared = self._shared
        if shared.generators is None:
            shared.generators = generators(self._names)
        if shared.callers is None:
            shared.callers = [generator.snapshot() for generator in shared.generators]
        for generator in shared.generators:
            generator.seed(seed)

    def restore(self) -> None:
        """Give the caller's generators the states they had before this batch's first seeding."""
        shared = self._shared
        if shared.callers is not None:
            for generator, state in zip(shared.generators, shared.callers):
                generator.restore(state)
            shared.callers = None


class _Shared:
    """A seeding's generators, found in each process at first use (never pickled), and the
    caller's states to restore."""

    def __init__(self) -> None:
        self.generators: list[Generator] | None = None
        self.callers: list[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"generators": None, "callers": None}
