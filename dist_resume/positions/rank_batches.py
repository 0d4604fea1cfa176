"""The positions of a rank's batches: the elastic plan's stream laid out in its batches."""

from __future__ import annotations

import torch

from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.layout import Layout


def rank_positions(plan: Plan, layout: Layout, rank: int, first: int, stop: int) -> tuple[torch.Tensor, list[int]]:
    """Positions of batches `[first, stop)` of rank `rank` (padding included), concatenated,
    and the size of each batch."""
    parts: list[torch.Tensor] = []
    sizes: list[int] = []
    shift = plan.shift
    full_stop = min(stop, layout.full_steps)
    if shift is not None and first < full_stop:
        # Full steps of a shifted stream: one vectorized block.
        starts = torch.arange(first, full_stop) * layout.global_batch + (shift + rank * layout.batch_size)
        parts.append((starts[:, None] + torch.arange(layout.batch_size)).reshape(-1))
        sizes += [layout.batch_size] * (full_stop - first)
        first = full_stop
    for index in range(first, stop):
        batch = layout.batch(rank, index)
        runs = [torch.arange(start, start + count) for start, count in plan.runs(batch.start, batch.stop)]
        padding = torch.arange(batch.padding_start, batch.padding_start + batch.padding) % max(plan.dataset_length, 1)
        parts += runs + [padding]
        sizes.append(len(batch))
    if not parts:
        return torch.empty(0, dtype=torch.int64), sizes
    return torch.cat(parts), sizes
