"""Per-sample randomness (G4): which global generators are seeded before each sample, and the
sample's own generator for code that asks for it (`sample_generator()`, `sample_seed()`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from dist_resume.randomness.global_generators import NAMES, Generator, generators, joint_snapshot
from dist_resume.randomness.seeds import own_generator_seed


class _Context:
    """The sample being fetched in this process: its seed while a seeded fetch runs; while an
    unseeded one runs, `fetching` is set so that a request for a seed can be noticed."""

    def __init__(self) -> None:
        self.seed: int | None = None
        self.fetching = False
        self.asked = False
        self.generator = torch.Generator()
        self.generator_seed: int | None = None


CONTEXT = _Context()  # one per process: fetches in a process do not overlap


def sample_seed() -> int:
    """The seed of the sample being fetched: from `(seed, epoch, position)` (G4), the same on
    every rank, worker and resume. Call it inside a dataset's `__getitem__`."""
    context = CONTEXT
    if context.seed is not None:
        return context.seed
    if context.fetching:
        # An unseeded fetch: the loader fetches this batch again with seeds (see SampleRandomness).
        context.asked = True
        return 0
    raise RuntimeError("sample_seed()/sample_generator() are only valid inside a dataset's __getitem__ "
                       "called by ResumableDataLoader")


def sample_generator() -> torch.Generator:
    """A CPU `torch.Generator` for the sample being fetched, seeded from its `(seed, epoch,
    position)` (G4) and independent of the global generators. Valid inside `__getitem__`:
    within one sample, every call returns the same generator, continuing its draws."""
    seed = sample_seed()
    context = CONTEXT
    if context.generator_seed is None or context.seed is None:
        context.generator.manual_seed(own_generator_seed(seed))
        context.generator_seed = seed
    return context.generator


def parse_choice(value: bool | Iterable[str]) -> bool | frozenset[str]:
    """`deterministic_transforms`: True (every global generator the dataset draws from), False,
    or the names of the generators to seed before every sample."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"deterministic_transforms must be True, False or a set of {set(NAMES)}, got {value!r}")
    names = frozenset(value)
    unknown = sorted(names - set(NAMES))
    if unknown:
        raise ValueError(f"deterministic_transforms: unknown generators {unknown}; choose from {list(NAMES)}")
    return names


def _snapshot_of(watched: list[Generator]) -> tuple[Callable[[], Any], Callable[[Any], list[Any]]] | None:
    """One call that snapshots every generator of `watched`, and what splits its result into
    each one's `snapshot()` (None: nothing is watched). Taken twice per batch, so the common
    cases skip the loop."""
    if not watched:
        return None
    joint = joint_snapshot(watched)
    if joint is not None:
        return joint
    calls = [generator.snapshot for generator in watched]
    return (lambda: [call() for call in calls]), list

class SampleRandomness:
    """What one process seeds before each sample, learnt from the batches it fetches.

    With `choice=True`, a generator is not seeded until a batch draws from it: each batch is
    fetched between two snapshots of the unseeded generators, and a batch that drew from one
    is fetched again, with every sample seeded, which makes it exact; that generator is then
    seeded before every sample. A batch that asks for `sample_seed()` is fetched again the
    same way. The caller's generator states are restored after every batch, so at
    `num_workers=0` the training loop's randomness is its own. With `refetch=False` (a
    stateful dataset, whose state a second fetch would advance twice) nothing is learnt:
    the generators chosen are seeded from the first sample.
    """

    def __init__(self, choice: bool | frozenset[str], refetch: bool) -> None:
        names = tuple(NAMES) if choice is True else tuple(name for name in NAMES if choice and name in choice)
        learn = choice is True and refetch
        self.seeded: list[Generator] = [] if learn else generators(names)
        self.probed: list[Generator] = generators(names) if learn else []
        self.snapshot, self._split = _snapshot_of(self.watched) or (None, list)
        self.own = not refetch  # whether samples get their seed in the context
        self.clean_batches = 0
        # Whether a batch whose generators did not change needs nothing more (no caller
        # state to restore, no seed asked for).
        self.quiet = not self.seeded

    @property
    def watched(self) -> list[Generator]:
        """The generators snapshotted around a batch: the seeded ones, then the probed ones."""
        return self.seeded + self.probed

    def settle(self, before: list[Any], samples: list[Any], refetch: Callable[[], list[Any]],
               where: Callable[[], str]) -> list[Any]:
        """`samples`, or `refetch()` if they drew from a generator that was not seeded or
        asked for a seed; the caller's generator states (`before`, the snapshot of `watched`)
        restored either way."""
        callers = dict(zip(self.watched, self._split(before) if before else []))
        fetched_again = False
        while True:
            # A seeded fetch can take another path through the dataset than the unseeded
            # one, and draw from another generator: checked again after every fetch.
            drawn = [generator for generator in self.probed if generator.snapshot() != callers[generator]]
            asked = CONTEXT.asked
            if not drawn and not asked:
                break
            CONTEXT.asked = False
            self.own = self.own or asked
            if drawn:
                self._seed_from_now_on(drawn, where())
            samples = refetch()
            fetched_again = True
        for generator in self.seeded:
            generator.restore(callers[generator])
        if not fetched_again:
            self.clean_batches += 1
        return samples

    def _seed_from_now_on(self, drawn: list[Generator], where: str) -> None:
        names = ", ".join(f"`{generator.name}`" for generator in drawn)
        if self.clean_batches:
            warnings.warn(
                f"ResumableDataLoader: the dataset drew from {names} at {where}, after {self.clean_batches} "
                f"batches that did not; that batch was fetched again with per-sample seeds, and {names} "
                f"{'is' if len(drawn) == 1 else 'are'} seeded before every sample from now on (G4). "
                f"deterministic_transforms={sorted(generator.name for generator in self.seeded + drawn)} "
                "seeds from the first sample",
                stacklevel=2,
            )
        self.seeded = self.seeded + drawn
        self.probed = [generator for generator in self.probed if generator not in drawn]
        self.quiet = False
        self.snapshot, self._split = _snapshot_of(self.watched) or (None, list)
