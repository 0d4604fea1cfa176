"""Weights as integer quotas: the exact ratios the composition arithmetic realizes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from numbers import Real

from dist_resume.arguments import checked_weight

# Quotas of a stage sum to at most this, so that `quota * position` stays in int64 for
# positions below MAX_POSITION.
MAX_TOTAL = 1 << 24
MAX_POSITION = (1 << 62) // MAX_TOTAL
_DENOMINATOR_LIMIT = 10**6


def _exact(weight: int | Fraction | float) -> Fraction:
    """A float as the ratio it was meant as (0.6 as 3/5) when one with a denominator up to
    10**6 lies within 2**-24 of it (relative), else as the float's own value: 4e-7 is not 0."""
    if not isinstance(weight, float):
        return Fraction(weight)
    value = Fraction(weight)
    ratio = value.limit_denominator(_DENOMINATOR_LIMIT)
    return ratio if abs(ratio - value) * MAX_TOTAL <= value else value


def quotas(weights: Mapping[str, Real], start: int = 0) -> list[int]:
    """Integer quotas in the ratio of `weights` (per source name: non-negative, not all
    zero), for the stage starting at run position `start` (named in errors).

    Exact for integers, fractions, and floats that are ratios with denominators up to
    10**6 (0.6, 1/3, ...), when the reduced quotas sum to at most 2**24; otherwise each
    weight is rounded to a multiple of 2**-24 of the total (largest remainders). A source
    with a positive weight always gets a positive quota: a weight that would round to 0
    is refused (ValueError naming the source), never silently dropped.
    """
    exact = [_exact(checked_weight(weight)) for weight in weights.values()]
    if not any(exact):
        raise ValueError(f"mixture weights must not all be zero, got {list(weights.values())}")
    denominator = math.lcm(*(fraction.denominator for fraction in exact))
    scaled = [int(fraction * denominator) for fraction in exact]
    divisor = math.gcd(*scaled)
    reduced = [value // divisor for value in scaled]
    if sum(reduced) <= MAX_TOTAL:
        return reduced
    rounded = _largest_remainders(exact, MAX_TOTAL)
    for (name, weight), fraction, quota in zip(weights.items(), exact, rounded):
        if fraction and not quota:
            total = float(sum(exact))
            raise ValueError(
                f"mixture weight {weight!r} of source {name!r} (stage at position {start}) rounds to 0: "
                f"weights are realized to 2**-24 of the stage's total ({total:.6g}), so the source would "
                f"never be drawn; give it 0, or at least {_rounded_up(total / MAX_TOTAL):.3g}"
            )
    return rounded


def _rounded_up(value: float) -> float:
    """`value` rounded up to 3 significant digits: a weight of that size is not refused."""
    unit = 10.0 ** (math.floor(math.log10(value)) - 2)
    return math.ceil(value / unit) * unit


def _largest_remainders(weights: list[Fraction], total: int) -> list[int]:
    whole = sum(weights)
    shares = [weight * total / whole for weight in weights]
    floors = [math.floor(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (floors[i] - shares[i], i))
    for i in by_remainder[: total - sum(floors)]:
        floors[i] += 1
    return floors
