"""Seeds derived from integers, identical on every machine, process and torch version."""

from __future__ import annotations

from collections.abc import Sequence

import numpy

from dist_resume.randomness.global_generators import NAMES, generators

_MASK64 = (1 << 64) - 1
_SEED_BITS = (1 << 63) - 1
_VECTORIZED = 16  # positions from which numpy beats a Python loop
_GAMMA, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _splitmix64(value: int) -> int:
    value = (value + _GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _MIX1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX2) & _MASK64
    return value ^ (value >> 31)


_U64 = numpy.uint64
_GAMMA_U64, _MIX1_U64, _MIX2_U64, _SEED_BITS_U64 = (_U64(value) for value in (_GAMMA, _MIX1, _MIX2, _SEED_BITS))
_SHIFTS = tuple(_U64(bits) for bits in (30, 27, 31))


def _splitmix64_seeds(values: numpy.ndarray) -> numpy.ndarray:
    """`_splitmix64(v) & _SEED_BITS` of each uint64 `v`, in place: uint64 arithmetic wraps
    modulo 2**64 as the masks do, and in-place operations skip an allocation per step."""
    values += _GAMMA_U64
    values ^= values >> _SHIFTS[0]
    values *= _MIX1_U64
    values ^= values >> _SHIFTS[1]
    values *= _MIX2_U64
    values ^= values >> _SHIFTS[2]
    values &= _SEED_BITS_U64
    return values


def _absorb(state: int, part: int) -> int:
    return _splitmix64(state ^ (part & _MASK64))


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part and on their order."""
    state = 0
    for part in parts:
        state = _absorb(state, part)
    return state & _SEED_BITS


def derive_seeds(seed: int, epoch: int, positions: Sequence[int]) -> list[int]:
    """`derive_seed(seed, epoch, p)` for each `p` of `positions`, absorbing the shared
    `(seed, epoch)` prefix once instead of once per sample."""
    prefix = _absorb(_absorb(0, seed), epoch)
    if len(positions) < _VECTORIZED:
        return [_absorb(prefix, position) & _SEED_BITS for position in positions]
    if isinstance(positions, range):
        values = numpy.arange(positions.start, positions.stop, positions.step, dtype=numpy.uint64)
    else:
        values = numpy.array(positions, dtype=numpy.uint64)
    values ^= _U64(prefix)
    return _splitmix64_seeds(values).tolist()


# Salt of the seed handed to a sample's own generator, so that its draws differ from
# those of the global generators seeded for the same sample.
_OWN_GENERATOR = 0x6F776E


def own_generator_seed(sample_seed: int) -> int:
    """The seed of the generator `dist_resume.sample_generator()` hands to a sample."""
    return _absorb(sample_seed, _OWN_GENERATOR) & _SEED_BITS


class SampleSeeder:
    """Seeds the `torch` (CPU), `random` and `numpy` global generators before a sample is read."""

    def seed(self, seed: int) -> None:
        for generator in generators(NAMES):
            generator.seed(seed)
