"""Weights as integer quotas: the exact ratios the composition arithmetic realizes."""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Real

from dist_resume.arguments import checked_weight

# Quotas of a stage sum to at most this, so that `quota * position` stays in int64 for
# positions below MAX_POSITION.
MAX_TOTAL = 1 << 24
MAX_POSITION = (1 << 62) // MAX_TOTAL
_DENOMINATOR_LIMIT = 10**6


def quotas(weights: list[Real]) -> list[int]:
    """Integer quotas in the ratio of `weights` (non-negative, not all zero).

    Exact for integers, fractions, and floats that are ratios with denominators up to
    10**6 (0.6, 1/3, ...), when the reduced quotas sum to at most 2**24; otherwise each
    weight is rounded to a multiple of 2**-24 of the total (largest remainders).
    """
    exact = []
    for weight in map(checked_weight, weights):
        exact.append(Fraction(weight).limit_denominator(_DENOMINATOR_LIMIT) if isinstance(weight, float)
                     else Fraction(weight))
    if not any(exact):
        raise ValueError(f"mixture weights must not all be zero, got {list(weights)}")
    denominator = math.lcm(*(fraction.denominator for fraction in exact))
    scaled = [int(fraction * denominator) for fraction in exact]
    divisor = math.gcd(*scaled)
    reduced = [value // divisor for value in scaled]
    if sum(reduced) <= MAX_TOTAL:
        return reduced
    return _largest_remainders(exact, MAX_TOTAL)


def _largest_remainders(weights: list[Fraction], total: int) -> list[int]:
    whole = sum(weights)
    shares = [weight * total / whole for weight in weights]
    floors = [math.floor(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (floors[i] - shares[i], i))
    for i in by_remainder[: total - sum(floors)]:
        floors[i] += 1
    return floors
