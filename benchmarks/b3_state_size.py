"""B3: bytes of one rank's loader state, for datasets of 1e3 .. 1e8 samples."""

from __future__ import annotations

import io
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from dist_resume import ResumableDataLoader

from .report import FigureResult
from .timing import Stats
from .workloads import TinyDataset

KIB = 1024


def serialized_bytes(state: Any) -> int:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getbuffer().nbytes


def tensor_bytes(state: Any) -> int:
    """Bytes held in tensors anywhere in a nested state."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(value) for value in state)
    return 0


def state_after_one_batch(loader: Any) -> Any:
    next(iter(loader))
    return loader.state_dict()


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B3", "loader state of one rank after one batch, shuffled epoch", "bytes", log_scale=True)
    powers = range(3, 9)
    # torchdata's sampler materializes the epoch's permutation as a Python list (~40 B a sample).
    torchdata_max = 10**6 if quick else 10**7
    ours, payloads = [], []
    for power in powers:
        length, case = 10**power, f"1e{power} samples"
        state = state_after_one_batch(ResumableDataLoader(TinyDataset(length), batch_size=64, shuffle=True, seed=0))
        ours.append(serialized_bytes(state))
        result.add(case, "ResumableDataLoader: torch.save", Stats.exact(ours[-1]))
        payloads.append(tensor_bytes(state))
        result.add(case, "ResumableDataLoader: tensor bytes", Stats.exact(payloads[-1]))
        if length <= torchdata_max:
            state = state_after_one_batch(StatefulDataLoader(TinyDataset(length), batch_size=64, shuffle=True))
            result.add(case, "torchdata: torch.save", Stats.exact(serialized_bytes(state)))
            result.add(case, "torchdata: tensor bytes", Stats.exact(tensor_bytes(state)))
    largest = max(ours)
    result.check("serialized bytes, largest over all lengths", largest, f"<= {KIB}", largest <= KIB)
    result.check("serialized bytes, largest - smallest", largest - min(ours), "== 0", largest == min(ours))
    result.check("tensor bytes, largest over all lengths", max(payloads), f"<= {KIB}", max(payloads) <= KIB)
    result.notes += [
        f"torch.save of an empty dict alone takes {serialized_bytes({})} B (its zip container).",
        f"torchdata is measured up to {torchdata_max:.0e} samples: beyond, its sampler's "
        "materialized permutation needs GBs of memory before the first batch.",
        "num_workers=0 for both; torchdata's state with workers adds a snapshot per worker.",
    ]
    return [result]
