"""Batches of packed sequences for a model: inputs, shifted targets, per-document
positions, and the cumulative lengths that flash-attention's varlen kernels take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy
import torch
from torch.utils.data import get_worker_info

from dist_resume.arguments import checked_flag, checked_int
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
        rows = len(items)
        item_positions = numpy.stack([item[POSITION_IDS] for item in items])
        width = item_positions.shape[1]
        piece_starts = item_positions == 0
        starts = numpy.flatnonzero(piece_starts[:, :-1])
        block = rows * (width - 1)
        # every tensor of the batch is a view of one buffer: a batch that leaves a worker is
        # one segment of shared memory, not one per tensor
        sizes = (rows * width, block, block, rows, -(-(len(starts) + 1) // 2))
        tokens, targets, positions, num_tokens, cu_words = _int64_buffer(sum(sizes)).split(sizes)
        tokens, targets, positions = tokens.view(rows, width), targets.view(rows, -1), positions.view(rows, -1)
        cu_seqlens = cu_words.view(torch.int32)[:len(starts) + 1]
        token_rows, target_rows, position_rows, real, bounds = (
            tensor.numpy() for tensor in (tokens, targets, positions, num_tokens, cu_seqlens))
        numpy.stack([item[TOKENS] for item in items], out=token_rows)
        position_rows[...] = item_positions[:, :-1]
        target_rows[...] = token_rows[:, 1:]
        real[...] = [int(item[NUM_TOKENS]) for item in items]
        for row in numpy.flatnonzero(real < width).tolist():  # a target that is padding
            target_rows[row, max(int(real[row]) - 1, 0):] = self.ignore_index
        if self.mask_document_starts:
            target_rows[piece_starts[:, 1:]] = self.ignore_index
        bounds[:-1] = starts
        bounds[-1] = block
        return {"tokens": tokens, "inputs": tokens[:, :-1], "targets": targets, "position_ids": positions,
                "cu_seqlens": cu_seqlens, "max_seqlen": int(numpy.diff(bounds).max()), "num_tokens": num_tokens}


def _int64_buffer(numel: int) -> torch.Tensor:
    buffer = torch.empty(numel, dtype=torch.int64)
    # A batch leaves its worker through shared memory: moved there while still empty, it is
    # not copied into a segment at send, once per tensor.
    return buffer if get_worker_info() is None else buffer.share_memory_()


collate_packed = PackedCollate()
