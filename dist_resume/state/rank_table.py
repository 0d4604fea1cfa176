"""Every saved rank's copy of one small int64 field in one tensor (a column of the rank
table a save writes, see `dist_resume.checkpoint.rank_tables`), so that a resume at another
world size reads all ranks' progress with a request per field instead of one per rank.

Layout of one column of `R` ranks, all int64::

    [R, rank_1 .. rank_R (ascending), length_1 .. length_R, values of rank_1, .., values of rank_R]

Decoding checks every count against the tensor's own length: a damaged or crafted column
is one ResumeStateError, never a wrong entry or an allocation the bytes do not back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from dist_resume.state.fields import MAX_WORLD_SIZE, ResumeStateError

# Beside each saved rank's entries under a loader's key (not named like one: `rank_N`); plain `dcp.load` into a loader's
# state dict never asks for it.
RANK_TABLE_KEY = "table_of_ranks__read_by_dist_resume_load_checkpoint"


def encode_column(rows: Mapping[int, torch.Tensor]) -> torch.Tensor:
    """One column from each rank's 1-D int64 value."""
    ranks = sorted(rows)
    values = [rows[rank].reshape(-1) for rank in ranks]
    header = torch.tensor([len(ranks), *ranks, *(len(value) for value in values)], dtype=torch.int64)
    return torch.cat([header, *values])


def decode_column(column: Any, what: str) -> dict[int, torch.Tensor]:
    """Each rank's value in ``column`` (views of it), every count checked."""
    if not isinstance(column, torch.Tensor) or column.dtype != torch.int64 or column.dim() != 1 or not len(column):
        raise ResumeStateError(f"{what} is not a non-empty 1-D int64 tensor")
    count = int(column[0])
    if not 0 < count <= min(MAX_WORLD_SIZE, (len(column) - 1) // 2):
        raise ResumeStateError(f"{what} says it holds {count} ranks in {len(column)} values")
    ranks = column[1:1 + count]
    lengths = column[1 + count:1 + 2 * count]
    start = 1 + 2 * count
    if bool((lengths < 0).any()) or bool((lengths > len(column)).any()) or int(lengths.sum()) != len(column) - start:
        raise ResumeStateError(f"{what} is damaged: its lengths do not add up to the values it holds")
    if bool((ranks < 0).any()) or bool((ranks >= MAX_WORLD_SIZE).any()) or bool((ranks[1:] <= ranks[:-1]).any()):
        raise ResumeStateError(f"{what} is damaged: its ranks are not distinct, ascending and below {MAX_WORLD_SIZE}")
    values = column[start:].split(lengths.tolist())
    return dict(zip(ranks.tolist(), values))
