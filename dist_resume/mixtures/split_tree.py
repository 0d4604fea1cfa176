"""The low-discrepancy composition of one stage: which source each position of the stage
reads, and how many positions each source has among the first `n`.

The sources are the leaves of a balanced binary tree. A node receives a sub-sequence of
the stage's positions and splits it between its children in the ratio of their quotas,
Bresenham-style: of the node's first `n` positions, `(left * n + phase) // total` go
left. So the first `n` positions of a stage hold `count(s, n)` positions of source `s`,
computed in O(depth) with nothing materialized, and each count grows by exactly one at the
positions of its source.

Bound: over any window of `W` consecutive positions of a stage, source `s` has
`|count - w_s * W| < depth(s)`, `depth(s)` being its depth in the tree (at most
`ceil(log2(sources))`): < 1 for two sources, < 2 for three or four, < 3 up to eight (a
lone source, depth 0, has exactly `W`). At one
node the rounding term `(left * n + phase) // total - left * n / total` lies in a
half-open interval of width below one, so a window's count deviates by less than one
plus the ratio times the parent's window deviation.
"""

from __future__ import annotations

from typing import TypeVar

import numpy
import torch

from dist_resume.randomness.seeds import derive_seed

_Int = TypeVar("_Int", int, numpy.ndarray)
_PHASE_TAG = 0x6D6978  # "mix": phases differ from every other use of derive_seed


def _left_count(left: _Int, total: _Int, phase: _Int, n: _Int) -> _Int:
    """Of a node's first `n` positions, how many go to its left child (phase < total)."""
    return (left * n + phase) // total


class SplitTree:
    """The split tree of one stage over `len(quotas)` sources (integer quotas, sum > 0).

    `phase_key` (the stage's start) varies where the rounding falls between stages.
    """

    def __init__(self, quotas: list[int], phase_key: int) -> None:
        self.quotas = quotas
        # Node arrays; a leaf is its own child with left == total, so descending
        # through it leaves the count unchanged.
        self._left: list[int] = []
        self._total: list[int] = []
        self._phase: list[int] = []
        self._children: list[tuple[int, int]] = []
        self._leaf_of_source: dict[int, int] = {}
        self._source_of_node: list[int] = []
        self._path: dict[int, list[tuple[int, bool]]] = {}
        self.depth = 0
        self._build(0, len(quotas), phase_key, [], 0)
        self._arrays = tuple(numpy.array(values, dtype=numpy.int64) for values in (
            self._left, self._total, self._phase, [c[0] for c in self._children], [c[1] for c in self._children],
            self._source_of_node))

    def _build(self, lo: int, hi: int, phase_key: int, path: list[tuple[int, bool]], depth: int) -> int:
        node = len(self._left)
        self._left.append(1)
        self._total.append(1)
        self._phase.append(0)
        self._children.append((node, node))
        self._source_of_node.append(lo)
        self.depth = max(self.depth, depth)
        if hi - lo == 1:
            self._leaf_of_source[lo] = node
            self._path[lo] = path
            return node
        mid = (lo + hi) // 2
        left, total = sum(self.quotas[lo:mid]), sum(self.quotas[lo:hi])
        # A node no position reaches (total 0) keeps a harmless total of 1.
        self._left[node], self._total[node] = left, max(total, 1)
        self._phase[node] = derive_seed(_PHASE_TAG, phase_key, node) % max(total, 1)
        first = self._build(lo, mid, phase_key, path + [(node, True)], depth + 1)
        second = self._build(mid, hi, phase_key, path + [(node, False)], depth + 1)
        self._children[node] = (first, second)
        return node

    def depth_of(self, source: int) -> int:
        return len(self._path[source])

    def count(self, source: int, n: int) -> int:
        """Positions of `source` among the stage's first `n` positions."""
        for node, goes_left in self._path[source]:
            left = _left_count(self._left[node], self._total[node], self._phase[node], n)
            n = left if goes_left else n - left
        return n

    def assign(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For stage positions (int64), the source of each and how many positions of
        that source come before it in the stage (its draw number within the stage)."""
        sources, draws = self.assign_array(positions.numpy())
        return torch.from_numpy(sources), torch.from_numpy(draws)

    def assign_array(self, positions: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray]:
        """`assign` on an int64 numpy array (a chunk of positions: numpy's fixed cost per
        operation is a fraction of torch's)."""
        left, total, phase, first, second, source_of = self._arrays
        node = numpy.zeros_like(positions)
        draw = positions
        for _ in range(self.depth):
            node_left, node_total, node_phase = left[node], total[node], phase[node]
            before = _left_count(node_left, node_total, node_phase, draw)
            goes_left = _left_count(node_left, node_total, node_phase, draw + 1) > before
            draw = numpy.where(goes_left, before, draw - before)
            node = numpy.where(goes_left, first[node], second[node])
        return source_of[node], draw
