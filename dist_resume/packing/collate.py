"""Batches of packed sequences for a model: inputs, shifted targets, per-document
positions, and the cumulative lengths that flash-attention's varlen kernels take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy
import torch
from torch.utils.data import get_worker_info

from dist_resume.arguments import checked_flag, checked_int
from dist_resume.packing.documents import past_int64
from dist_resume.packing.sequences import NUM_TOKENS, POSITION_IDS, TOKENS

IGNORE_INDEX = -100  # what torch's cross_entropy ignores by default


class PackedCollate:
    """`collate_fn` for packed sequences (`packed`, `TokenSequences`): a batch of `B`
    sequences of `seq_len + 1` tokens becomes

    - ``tokens``: int64 `[B, seq_len + 1]`, the sequences as packed;
    - ``inputs``: `tokens[:, :-1]` and ``targets``: `tokens[:, 1:]`, a target that is
      padding set to `ignore_index` (and, with `mask_document_starts`, a target that
      starts a document piece, so no token learns to predict across a boundary);
    - ``position_ids``: int64 `[B, seq_len]`, each input's place in its document piece;
    - ``cu_seqlens``: int32 `[pieces + 1]`, where each piece of the flattened inputs
      (`B * seq_len` tokens, row after row; padding is a piece of its own) starts, and the
      total; ``max_seqlen``: the longest piece (an int): what
      `flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)`
      takes to attend within documents only;
    - ``num_tokens``: int64 `[B]`, each sequence's real (not padding) tokens."""

    def __init__(self, ignore_index: int = IGNORE_INDEX, mask_document_starts: bool = False) -> None:
        self.ignore_index = checked_int("ignore_index", ignore_index, -2**63, 2**63)
        self.mask_document_starts = checked_flag("mask_document_starts", mask_document_starts)

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return self._batch(len(items), [(slice(None), _stacked(items, TOKENS), _stacked(items, POSITION_IDS),
                                         [int(item[NUM_TOKENS]) for item in items])])

    def collate_part(self, items: Sequence[dict[str, Any]]) -> PackedPart:
        """Some rows of a batch, as a worker that read them sends them on (`join_parts`
        makes the batch): the same values in fewer bytes."""
        return PackedPart(_narrowed(_stacked(items, TOKENS)), _narrowed(_stacked(items, POSITION_IDS)),
                          numpy.array([int(item[NUM_TOKENS]) for item in items], dtype=numpy.int64))

    def join_parts(self, parts: Sequence[tuple[Sequence[int], PackedPart]]) -> dict[str, Any]:
        """The batch `self(items)` makes, from `(rows, self.collate_part([items[row] for row
        in rows]))` pairs that hold every row of `items` once: a batch whose rows several
        workers read is the batch one process collates."""
        rows = sum(len(part_rows) for part_rows, _ in parts)
        if sorted(row for part_rows, _ in parts for row in part_rows) != list(range(rows)):
            raise ValueError(f"PackedCollate: the parts' rows {[list(part_rows) for part_rows, _ in parts]} "
                             f"are not each row of a batch of {rows} once")
        _same_widths(TOKENS, [part.tokens.shape[1:] for _, part in parts])
        return self._batch(rows, [(numpy.asarray(part_rows, dtype=numpy.int64), *part) for part_rows, part in parts])

    def _batch(self, rows: int, parts: list[tuple[Any, numpy.ndarray, numpy.ndarray, Any]]) -> dict[str, Any]:
        # parts: (where their rows go, tokens [r, width], position_ids [r, width], num_tokens [r])
        width = parts[0][1].shape[1]
        piece_starts = numpy.empty((rows, width), dtype=bool)
        for index, _, positions, _ in parts:
            piece_starts[index] = positions == 0
        starts = numpy.flatnonzero(piece_starts[:, :-1])
        batch = _Batch(rows, width, len(starts))
        for index, tokens, positions, real in parts:
            batch.token_rows[index] = tokens
            batch.position_rows[index] = positions[:, :-1]
            batch.real[index] = real
        target_rows, real = batch.target_rows, batch.real
        target_rows[...] = batch.token_rows[:, 1:]
        for row in numpy.flatnonzero(real < width).tolist():  # a target that is padding
            target_rows[row, max(int(real[row]) - 1, 0):] = self.ignore_index
        if self.mask_document_starts:
            target_rows[piece_starts[:, 1:]] = self.ignore_index
        return batch.finished(starts)


class PackedPart(NamedTuple):
    """Rows of a batch of packed sequences, from the worker that read them
    (`PackedCollate.collate_part`): tokens and position ids in the narrowest integer type
    that holds their values, so that fewer bytes cross the worker's pipe."""

    tokens: numpy.ndarray
    position_ids: numpy.ndarray
    num_tokens: numpy.ndarray


class _Batch:
    """The tensors of a batch of `rows` sequences of `width` tokens with `pieces` document
    pieces, as views of one int64 buffer: a batch that leaves a worker is one segment of
    shared memory, not one per tensor."""

    def __init__(self, rows: int, width: int, pieces: int) -> None:
        block = rows * (width - 1)
        sizes = (rows * width, block, block, rows, -(-(pieces + 1) // 2))
        tokens, targets, positions, num_tokens, cu_words = _int64_buffer(sum(sizes)).split(sizes)
        self.tokens, self.targets = tokens.view(rows, width), targets.view(rows, -1)
        self.positions, self.num_tokens = positions.view(rows, -1), num_tokens
        self.cu_seqlens = cu_words.view(torch.int32)[:pieces + 1]
        self.token_rows, self.target_rows, self.position_rows, self.real = (
            tensor.numpy() for tensor in (self.tokens, self.targets, self.positions, self.num_tokens))

    def finished(self, starts: numpy.ndarray) -> dict[str, Any]:
        """The batch, its pieces starting at `starts` of the flattened inputs."""
        bounds = self.cu_seqlens.numpy()
        bounds[:-1] = starts
        bounds[-1] = self.positions.numel()
        return {"tokens": self.tokens, "inputs": self.tokens[:, :-1], "targets": self.targets,
                "position_ids": self.positions, "cu_seqlens": self.cu_seqlens,
                "max_seqlen": int(numpy.diff(bounds).max()), "num_tokens": self.num_tokens}


def _stacked(items: Sequence[dict[str, Any]], key: str) -> numpy.ndarray:
    _same_widths(key, [numpy.shape(item[key]) for item in items])
    values = numpy.stack([item[key] for item in items])
    if values.dtype.kind not in "iu":
        raise TypeError(f"PackedCollate: a sequence's {key} are {values.dtype}, not integers")
    largest = past_int64(values)
    if largest is not None:
        raise ValueError(f"PackedCollate: a sequence's {key} hold {largest}, past int64 (a batch is int64)")
    return values


def _same_widths(key: str, shapes: Sequence[tuple[int, ...]]) -> None:
    if len(set(shapes)) > 1:
        raise ValueError(f"PackedCollate: one batch holds {key} of shapes {sorted(set(shapes))}; every sequence "
                         "of a batch has the same seq_len + 1 tokens")


def _narrowed(values: numpy.ndarray) -> numpy.ndarray:
    if not values.size:
        return values
    dtype = numpy.promote_types(numpy.min_scalar_type(int(values.min())), numpy.min_scalar_type(int(values.max())))
    # beyond 32 bits (or int64 next to uint64, promoted to float) nothing is saved
    return values.astype(dtype) if dtype.kind in "iu" and dtype.itemsize < values.dtype.itemsize else values


def _int64_buffer(numel: int) -> torch.Tensor:
    buffer = torch.empty(numel, dtype=torch.int64)
    # A batch leaves its worker through shared memory: moved there while still empty, it is
    # not copied into a segment at send, once per tensor.
    return buffer if get_worker_info() is None else buffer.share_memory_()


collate_packed = PackedCollate()
