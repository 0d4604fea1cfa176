"""Batches of packed sequences for a model: inputs, shifted targets, per-document
positions, and the cumulative lengths that flash-attention's varlen kernels take."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy
import torch

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
        tokens = _stacked([item[TOKENS] for item in items])
        positions = _stacked([item[POSITION_IDS] for item in items])
        num_tokens = torch.tensor([int(item[NUM_TOKENS]) for item in items], dtype=torch.int64)
        targets = tokens[:, 1:].clone()
        padding = torch.arange(1, tokens.shape[1]).unsqueeze(0) >= num_tokens.unsqueeze(1)
        if self.mask_document_starts:
            padding |= positions[:, 1:] == 0
        targets[padding] = self.ignore_index
        inputs_positions = positions[:, :-1].contiguous()
        starts = numpy.flatnonzero(inputs_positions.numpy().reshape(-1) == 0)
        cu_seqlens = torch.from_numpy(numpy.append(starts, inputs_positions.numel()).astype(numpy.int32))
        max_seqlen = int(numpy.diff(cu_seqlens.numpy()).max())
        return {"tokens": tokens, "inputs": tokens[:, :-1], "targets": targets, "position_ids": inputs_positions,
                "cu_seqlens": cu_seqlens, "max_seqlen": max_seqlen, "num_tokens": num_tokens}


def _stacked(rows: list[Any]) -> torch.Tensor:
    if isinstance(rows[0], torch.Tensor):
        return torch.stack(rows).to(torch.int64)
    return torch.from_numpy(numpy.stack(rows).astype(numpy.int64, copy=False))


collate_packed = PackedCollate()
