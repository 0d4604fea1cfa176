"""Batches that carry where they came from, and workers that continue another worker's stream.

A worker's *role* is the stream it serves: its dataset state and, for iterable datasets,
the worker id the dataset sees. A resumed loader's worker `j` may play another role than
`j` so that the next batch comes from the stream that an uninterrupted run would have used.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from torch.utils.data import _utils, get_worker_info


class Tagged(NamedTuple):
    """A collated batch, from the worker of role `role`, with `items` samples and what the
    main process records when it yields the batch (`payload`)."""

    batch: Any
    role: int
    items: int
    payload: Any


def is_stateful(obj: Any) -> bool:
    """Whether `obj` saves and restores its state (torchdata's Stateful protocol)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def play_role(shift: int, dataset: Any) -> int:
    """In a loader worker: take the role `(id + shift) % num_workers`; from then on
    `get_worker_info()` reports it as the id, and `dataset` (the user's copy, not the
    loader's wrapper) as the dataset. Returns the role."""
    info = get_worker_info()
    role = (info.id + shift) % info.num_workers
    # WorkerInfo is frozen; torch's get_worker_info() returns this module global.
    _utils.worker._worker_info = dataclasses.replace(info, id=role, dataset=dataset)
    return role
