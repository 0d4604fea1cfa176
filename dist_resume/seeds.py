"""Seeds derived from integers, identical on every machine, process and torch version."""

from __future__ import annotations

import random

import torch

_MASK64 = (1 << 64) - 1
_SEED_BITS = (1 << 63) - 1


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _absorb(state: int, part: int) -> int:
    return _splitmix64(state ^ (part & _MASK64))


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part and on their order."""
    state = 0
    for part in parts:
        state = _absorb(state, part)
    return state & _SEED_BITS


def derive_seeds(seed: int, epoch: int, positions: list[int]) -> list[int]:
    """`derive_seed(seed, epoch, p)` for each `p` of `positions`, absorbing the shared
    `(seed, epoch)` prefix once instead of once per sample."""
    prefix = _absorb(_absorb(0, seed), epoch)
    return [_absorb(prefix, position) & _SEED_BITS for position in positions]


def _numpy_random():
    # Imported on first use in each process: a dataset may import numpy lazily
    # inside __getitem__, after the seeding, so "not yet imported" is not enough.
    try:
        import numpy.random
    except ImportError:
        return None
    return numpy.random


class SampleSeeder:
    """Seeds the `torch` (CPU), `random` and `numpy` global generators before a sample is read."""

    def __init__(self) -> None:
        self._numpy_random = None
        self._numpy_checked = False

    def seed(self, seed: int) -> None:
        # torch.manual_seed would also seed every accelerator generator (100x slower);
        # samples are produced by CPU code in loader workers.
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        if not self._numpy_checked:
            self._numpy_random = _numpy_random()
            self._numpy_checked = True
        if self._numpy_random is not None:
            self._numpy_random.seed(seed & 0xFFFFFFFF)
