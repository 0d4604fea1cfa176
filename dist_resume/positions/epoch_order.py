"""The epoch order: which dataset index sits at each position of an epoch."""

from __future__ import annotations

from typing import TypeVar

import numpy
import torch

from dist_resume.randomness.seeds import derive_seed

_ROUNDS = 4
_LOW31 = 0x7FFFFFFF
_MAX_HALF_BITS = 31  # keeps every product below 2**62: no int64 overflow
_SCALAR_WALK = 8

_Int = TypeVar("_Int", int, numpy.ndarray)


class EpochOrder:
    """`order_e`: a permutation of `range(length)` drawn from `(seed, epoch)`, or the identity.

    Any position maps to its index in O(1) with nothing materialized, so an epoch of
    any length starts (or resumes at any position) at the same cost. The permutation
    is pure integer arithmetic: the same on every machine and torch version.
    """

    def __init__(self, length: int, seed: int, epoch: int, shuffle: bool) -> None:
        if length < 0:
            raise ValueError(f"dataset length must be >= 0, got {length}")
        self.length = length
        self.shuffle = shuffle
        if not shuffle or length < 2:
            self._keys: list[int] = []
            return
        # Unbalanced halves keep the permuted domain [0, 2**bits) below 2 * length,
        # so cycle walking (below) takes few steps.
        bits = max(2, (length - 1).bit_length())
        if bits > 2 * _MAX_HALF_BITS:
            raise ValueError(f"dataset length {length} is larger than 2**62")
        self._high_bits = (bits + 1) // 2
        self._low_bits = bits // 2
        self._keys = [derive_seed(seed, epoch, round_) & _LOW31 for round_ in range(_ROUNDS)]

    def indices(self, positions: torch.Tensor) -> list[int]:
        """Dataset indices at `positions` (int64, each in `[0, length)`)."""
        if not self._keys:
            return positions.tolist()
        return self.index_array(positions.numpy()).tolist()

    def index_array(self, positions: numpy.ndarray) -> numpy.ndarray:
        """`indices` for an int64 numpy array, as a new int64 array."""
        if not self._keys:
            return positions.copy()
        # numpy: the same integer arithmetic as torch, at a fraction of its fixed cost per
        # operation, which dominates the small arrays that cycle walking works on.
        permuted = self._permute_domain(positions)
        # Cycle walking: the Feistel network permutes [0, 2**bits); re-applying it to
        # values past the end walks each one to the next in-range value of its cycle,
        # which keeps the map a bijection of [0, length). Fewer than half the values
        # walk at each step; the last few walk as Python ints, where a step is cheaper
        # than the fixed cost of an array operation.
        outside = numpy.flatnonzero(permuted >= self.length)
        while outside.size > _SCALAR_WALK:
            walked = self._permute_domain(permuted[outside])
            permuted[outside] = walked
            outside = outside[walked >= self.length]
        for slot in outside.tolist():
            value = self._permute_domain(int(permuted[slot]))
            while value >= self.length:
                value = self._permute_domain(value)
            permuted[slot] = value
        return permuted

    def position_of(self, index: int) -> int:
        """The position at which dataset index `index` (in `[0, length)`) comes: the
        inverse of `indices`, by the Feistel rounds backwards and the cycle walked back."""
        if not self._keys:
            return index
        value = self._unpermute_domain(index)
        while value >= self.length:
            value = self._unpermute_domain(value)
        return value

    def _unpermute_domain(self, value: int) -> int:
        high, low = value >> self._low_bits, value & ((1 << self._low_bits) - 1)
        high_bits, low_bits = self._high_bits, self._low_bits  # an even number of rounds restores the widths
        for key in reversed(self._keys):
            high_bits, low_bits = low_bits, high_bits  # the widths before this round
            mixed = ((high ^ key) * 0x5BD1E995) & _LOW31
            mixed = mixed ^ (mixed >> 15)
            mixed = (mixed * 0x2C1B3C6D) & _LOW31
            mixed = mixed ^ (mixed >> 12)
            high, low = low ^ (mixed & ((1 << high_bits) - 1)), high
        return (high << low_bits) | low

    def _permute_domain(self, values: _Int) -> _Int:
        # FFX-style Feistel on halves of unequal width: each round replaces the wider
        # (or equal) half and the widths swap; an even number of rounds restores them.
        # Written with operators only, so it serves int64 arrays and Python ints alike.
        high = values >> self._low_bits
        low = values & ((1 << self._low_bits) - 1)
        high_bits, low_bits = self._high_bits, self._low_bits
        for key in self._keys:
            mixed = ((low ^ key) * 0x5BD1E995) & _LOW31
            mixed = mixed ^ (mixed >> 15)
            mixed = (mixed * 0x2C1B3C6D) & _LOW31
            mixed = mixed ^ (mixed >> 12)
            high, low = low, high ^ (mixed & ((1 << high_bits) - 1))
            high_bits, low_bits = low_bits, high_bits
        return (high << low_bits) | low
