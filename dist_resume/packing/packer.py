"""Packing one shard's documents, in their order, into sequences of `width` tokens; and
the number of sequences that makes, from the documents' lengths alone."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy

from dist_resume.packing.sequences import padding_before, sequence_item


class Packer:
    """Documents in (1-D int64 arrays, in order), sequences out: concatenated and cut
    every `width` tokens, or, with `fit`, a document that does not fit into what is left
    of a sequence but fits a whole one starts the next sequence (the rest of this one is
    padding); a document longer than a sequence is cut. Every token of every document is
    in exactly one sequence, in order; only the last sequence (and with `fit` the ones a
    document closed) holds padding."""

    def __init__(self, width: int, fit: bool, pad_id: int) -> None:
        self._width = width
        self._fit = fit
        self._pad_id = pad_id
        self._pieces: list[numpy.ndarray] = []  # of the sequence being filled
        self._starts: list[int] = []  # where each piece starts in it
        self._fill = 0

    def add(self, tokens: numpy.ndarray) -> Iterator[dict[str, Any]]:
        """The sequences that `tokens`, the next document, completes."""
        length, width = len(tokens), self._width
        if padding_before(self._fill, length, width, self._fit):
            yield self._sequence(self._fill)
        offset = 0
        while offset < length:
            take = min(width - self._fill, length - offset)
            self._starts.append(self._fill)
            self._pieces.append(tokens[offset:offset + take])
            self._fill += take
            offset += take
            if self._fill == width:
                yield self._sequence(width)

    def end(self) -> Iterator[dict[str, Any]]:
        """The last sequence, padded, if one is being filled."""
        if self._fill:
            yield self._sequence(self._fill)

    def _sequence(self, num_tokens: int) -> dict[str, Any]:
        if num_tokens == self._width:
            tokens = self._pieces[0] if len(self._pieces) == 1 else numpy.concatenate(self._pieces)
        else:
            tokens = numpy.full(self._width, self._pad_id, dtype=numpy.int64)
            numpy.concatenate(self._pieces, out=tokens[:num_tokens])
        item = sequence_item(tokens, self._starts, num_tokens)
        self._pieces, self._starts, self._fill = [], [], 0
        return item


def count_sequences(lengths: Iterable[int], width: int, fit: bool) -> int:
    """The sequences `Packer` makes of documents of `lengths` tokens."""
    sequences, fill = 0, 0
    for length in lengths:
        filled = fill + padding_before(fill, length, width, fit) + length
        sequences += filled // width
        fill = filled % width
    return sequences + (fill > 0)
