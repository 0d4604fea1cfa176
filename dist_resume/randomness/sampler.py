"""The randomness of a user sampler without `state_dict` (RandomSampler,
WeightedRandomSampler, SubsetRandomSampler, ... seeded through `generator` or not): the
state of the generator it draws an epoch from, recorded when the epoch's first index is
drawn, so that a resume draws the same epoch again (G1) and leaves torch's default
generator as the caller had it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

SAMPLER_RNG_KEY = "sampler_rng"
_END = object()


def _random_source(sampler: Any) -> tuple[bool, torch.Generator | None]:
    """Whether `sampler` (or the sampler a batch sampler wraps) draws from a generator
    (torch's samplers have a `generator` attribute), and which: None is torch's default."""
    for candidate in (sampler, getattr(sampler, "sampler", None)):
        if candidate is not None and hasattr(candidate, "generator"):
            generator = candidate.generator
            return True, generator if isinstance(generator, torch.Generator) else None
    return False, None


class SamplerRandomness:
    """The generator state a random sampler starts the current epoch from."""

    def __init__(self, sampler: Any) -> None:
        self.applies, self._generator = _random_source(sampler)
        self.start: torch.Tensor | None = None

    def reset(self) -> None:
        self.start = None

    def iterate(self, sampler: Iterable[Any]) -> Iterator[Any]:
        """`iter(sampler)`, drawing the epoch from the recorded start state if there is one."""
        source = self._generator if self._generator is not None else torch.default_generator
        if self.start is None:
            self.start = source.get_state()
            return iter(sampler)
        callers = source.get_state() if self._generator is None else None
        source.set_state(self.start)
        iterator = iter(sampler)
        try:
            # torch's samplers draw at their first index (a permutation, multinomial or seed).
            first = next(iterator, _END)
        finally:
            if callers is not None:
                source.set_state(callers)
        return iter(()) if first is _END else itertools.chain([first], iterator)

    def state(self) -> torch.Tensor | None:
        """The start state as int64: its byte count, then its bytes packed 8 to a value (G8)."""
        if self.start is None:
            return None
        raw = self.start.to(torch.uint8)
        padded = torch.cat([raw, raw.new_zeros(-len(raw) % 8)])
        return torch.cat([torch.tensor([len(raw)], dtype=torch.int64), padded.view(torch.int64)])

    def accept(self, packed: torch.Tensor | None) -> Callable[[], None]:
        """Read a saved start state (of `state()`); return what makes it this epoch's."""
        start = None if packed is None else packed[1:].clone().view(torch.uint8)[: int(packed[0])].clone()

        def adopt() -> None:
            self.start = start

        return adopt
