"""The composition of a stage whose weights count real tokens: which source each position
of the stage reads, paced by the real tokens that the sources' draws hold.

Each source's draws, in its order, hold known numbers of real tokens (`DrawTokens`, learnt
from the data when the Mixture is made: the same on every rank and worker). Let `C_s(d)` be
the real tokens of source `s`'s first `d` draws of the stage and `q_s` its quota. Draw `d`
gets the key `(C_s(d) + C_s(d + 1)) / q_s`: the midpoint of the tokens it adds, over the
quota. The stage's positions read the draws of every source with a positive quota in the
order of their keys (the lower source first on a tie), so the first `n` positions hold the
`n` smallest keys: found at any `n` by a search for the keys' threshold, nothing replayed,
the same at every world size.

Bound. After any number of a stage's positions, let `t` be the key of the draw that comes
next and `X_s` source `s`'s real tokens drawn in the stage. Its last draw (of `n_l` tokens)
has a key `<= t` and its next one (`n_n` tokens) a key `>= t`, so `2 X_s - n_l <= q_s t <=
2 X_s + n_n`: `X_s = q_s t / 2 + e_s` with `|e_s| <= W / 2`, `W` the most real tokens a draw
holds (`seq_len + 1`). With `w_s = q_s / Q` its share (`Q` the sum of the positive quotas,
`S` their number) and `X` every source's tokens, `X_s - w_s X = (1 - w_s) e_s - w_s * (sum
of the others' e_j)`, so `|X_s - w_s X| <= (1 + w_s (S - 2)) W / 2`: half a sequence for two
sources, below one for three. Between any two positions of a stage (a global step, say),
twice that: one sequence for two sources.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Protocol

import numpy

_INT64_SAFE = 1 << 62
ADVANCE = 1 << 16  # positions a stage walks forward from the last one it answered, rather than searching
_CHUNK = 1 << 13  # positions merged at once


class DrawTokens(Protocol):
    """The real tokens of a source's draws, over its source-epochs, in its order."""

    width: int  # the most real tokens one draw holds
    average: float  # real tokens per draw on average: guides searches, never decides

    def before(self, draws: numpy.ndarray) -> numpy.ndarray:
        """Real tokens of the first `d` draws, for each `d` (int64, or Python ints past int64)."""

    def before_one(self, draw: int) -> int:
        """`before` of one draw count, as a Python int."""


def token_bound(quotas: Sequence[int], source: int, width: int) -> Fraction:
    """`(1 + w_s (S - 2)) W / 2`, exactly: the most that `source`'s real tokens drawn in a
    stage of `quotas` are off its share of every source's, at any position of the stage (0
    for a source without quota: it draws nothing)."""
    active = [quota for quota in quotas if quota > 0]
    if not quotas[source]:
        return Fraction(0)
    return (1 + Fraction(quotas[source], sum(active)) * (len(active) - 2)) * width / 2


def first_true(test: Callable[[int], bool], guess: int) -> int:
    """The smallest `x >= 0` with `test(x)` (monotone: false, then true), searched from `guess`."""
    guess = max(guess, 0)
    if test(guess):
        high, step = guess, 1
        while True:
            low = high - step
            if low < 0:
                low = -1
                break
            if not test(low):
                break
            high, step = low, step * 2
    else:
        low, step = guess, 1
        while True:
            high = low + step
            if test(high):
                break
            low, step = high, step * 2
    while high - low > 1:
        middle = (low + high) // 2
        if test(middle):
            high = middle
        else:
            low = middle
    return high


class TokenStage:
    """The composition of one stage by tokens: `quotas` per source, `offsets` the draws of
    each source before the stage starts, `draws` each source's `DrawTokens`. Answers as
    `split_tree.SplitTree` does: `count(source, n)` and `assign_array(positions)`."""

    def __init__(self, quotas: Sequence[int], offsets: Sequence[int], draws: Sequence[DrawTokens]) -> None:
        self.quotas = list(quotas)
        self._active = [source for source, quota in enumerate(quotas) if quota > 0]
        common = math.lcm(*(quotas[source] for source in self._active))
        self._scale = [common // quota if quota else 0 for quota in quotas]
        self._offsets = list(offsets)
        self._draws = draws
        self._base = [draws[source].before_one(offset) for source, offset in enumerate(offsets)]
        self._known = (0, [0] * len(quotas))  # a stage position and each source's draws before it

    def key(self, source: int, draw: int) -> int:
        """Twice the key of the stage's draw `draw` of `source`, times the quotas' least common multiple."""
        tokens, first = self._draws[source], self._offsets[source] + draw
        return (tokens.before_one(first) + tokens.before_one(first + 1) - 2 * self._base[source]) * self._scale[source]

    def count(self, source: int, n: int) -> int:
        """Draws of `source` among the stage's first `n` positions."""
        return self.counts(n)[source]

    def counts(self, n: int) -> list[int]:
        """Draws of every source among the stage's first `n` positions."""
        known, counts = self._known
        if n == known:
            return list(counts)
        if known < n <= known + ADVANCE:
            counts = self._merged(counts, n - known)[2]
        else:
            counts = self._searched(n)
        self._known = (n, counts)
        return list(counts)

    def assign_array(self, positions: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
        """For stage positions (int64), the source of each and its draw number within the stage."""
        values, inverse = numpy.unique(positions, return_inverse=True)
        if not len(values):
            return positions.copy(), positions.copy()
        sources = numpy.empty(len(values), dtype=numpy.int64)
        draws = numpy.empty(len(values), dtype=numpy.int64)
        breaks = numpy.flatnonzero(numpy.diff(values) != 1) + 1
        for begin, end in zip([0, *breaks.tolist()], [*breaks.tolist(), len(values)]):
            start = int(values[begin])
            counts = self.counts(start)
            at = begin
            while at < end:  # a run of consecutive positions: merged forward from its start
                size = min(end - at, _CHUNK)
                sources[at:at + size], draws[at:at + size], counts = self._merged(counts, size)
                at += size
                self._known = (start + at - begin, counts)
        return sources[inverse.reshape(-1)], draws[inverse.reshape(-1)]

    def _merged(self, counts: list[int], size: int) -> tuple[numpy.ndarray, numpy.ndarray, list[int]]:
        """The next `size` positions after each source drew `counts`: their sources, draw
        numbers and the counts after them."""
        keys = [self._keys(source, counts[source], size) for source in self._active]
        ids = numpy.repeat(numpy.array(self._active, dtype=numpy.int64), size)
        joined = numpy.concatenate(keys)
        if joined.dtype == object:  # keys past int64: compared as Python ints
            order = numpy.array(sorted(range(len(joined)), key=lambda i: (joined[i], ids[i]))[:size], dtype=numpy.int64)
        else:
            order = numpy.lexsort((ids, joined))[:size]
        taken = ids[order]
        draws = numpy.empty(size, dtype=numpy.int64)
        after = list(counts)
        for source in self._active:
            mine = taken == source
            drawn = int(mine.sum())
            draws[mine] = numpy.arange(counts[source], counts[source] + drawn)
            after[source] += drawn
        return taken, draws, after

    def _keys(self, source: int, first: int, size: int) -> numpy.ndarray:
        """`key` of the draws `[first, first + size)` of `source`."""
        tokens, start = self._draws[source], self._offsets[source] + first
        cumulative = tokens.before(numpy.arange(start, start + size + 1, dtype=numpy.int64))
        relative = cumulative - self._base[source]
        if (2 * (first + size + 1) * tokens.width + 1) * self._scale[source] >= _INT64_SAFE:
            relative = relative.astype(object)
        return (relative[:-1] + relative[1:]) * self._scale[source]

    def _searched(self, n: int) -> list[int]:
        """The counts after `n` positions, by a search for the threshold key: the largest
        `k` that at most `n` draws have keys below; the positions left go to draws whose
        key is `k`, lower sources first."""
        counts = [0] * len(self.quotas)
        if n == 0:
            return counts
        if len(self._active) == 1:
            counts[self._active[0]] = n
            return counts
        rate = sum(1 / (self._scale[source] * self._draws[source].average) for source in self._active)
        threshold = first_true(lambda k: self._below_all(k) > n, int(2 * n / rate)) - 1
        for source in self._active:
            counts[source] = self._below(source, threshold)
        left = n - sum(counts)
        for source in self._active:
            if left and self.key(source, counts[source]) == threshold:
                counts[source] += 1
                left -= 1
        assert left == 0, "a stage's threshold search lost positions"
        return counts

    def _below_all(self, k: int) -> int:
        return sum(self._below(source, k) for source in self._active)

    def _below(self, source: int, k: int) -> int:
        """Draws of `source` whose key is below `k`."""
        if k <= 0:
            return 0
        guess = int((k / self._scale[source] / self._draws[source].average - 1) / 2)
        return first_true(lambda draw: self.key(source, draw) >= k, guess)
