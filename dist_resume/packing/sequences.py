"""One packed sequence as every packer hands it on, and the placing rule of the two modes.

A sequence is `width = seq_len + 1` token slots (the model reads the first `seq_len` and
predicts the last `seq_len`): ``{"tokens": int64[width], "position_ids": int64[width],
"num_tokens": int}``. Its real tokens are the first `num_tokens`; the rest is padding
(`pad_id`), which only a sequence that ends a shard or a file, or one that a document
did not fit into (mode ``"fit"``), has. `position_ids` count each token's place in its
piece of a document, from 0 at every piece's start (a document cut between two sequences
is two pieces); padding counts from 0 as one piece of its own. So a piece starts exactly
where `position_ids` is 0, and every array has one fixed shape: torch's default collate
batches them, `collate_packed` adds what flash-attention's varlen kernels take.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy

TOKENS, POSITION_IDS, NUM_TOKENS = "tokens", "position_ids", "num_tokens"
MODES = ("concat", "fit")  # concatenate and cut; never cut a document that fits a sequence


def padding_before(fill: int, length: int, width: int, fit: bool) -> int:
    """Padding that closes the sequence being filled (`fill` tokens in it) before a
    document of `length` tokens: in mode "fit", what is left of it when the document does
    not fit there but fits a sequence of its own; else none (the document is cut)."""
    if fit and 0 < fill and fill + length > width >= length:
        return width - fill
    return 0


def sequence_item(tokens: numpy.ndarray, starts: Sequence[int], num_tokens: int) -> dict[str, Any]:
    """The sequence of `tokens` (its full width, padding included) whose document pieces
    start at `starts` (increasing, the first 0, all below `num_tokens`)."""
    width = len(tokens)
    counting = _counting(width)
    positions = numpy.empty(width, dtype=numpy.int64)
    bounds = [*starts, num_tokens, width] if num_tokens < width else [*starts, width]
    for begin, end in zip(bounds, bounds[1:]):  # a few pieces a sequence: a slice copy each
        positions[begin:end] = counting[:end - begin]
    return {TOKENS: tokens, POSITION_IDS: positions, NUM_TOKENS: num_tokens}


@functools.lru_cache(maxsize=8)
def _counting(width: int) -> numpy.ndarray:
    return numpy.arange(width, dtype=numpy.int64)


def checked_mode(mode: object) -> str:
    """`mode` if it names a packing mode; ValueError naming the modes otherwise."""
    if mode not in MODES:
        raise ValueError(f"packing mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode  # type: ignore[return-value]
