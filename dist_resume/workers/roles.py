"""Batches that carry where they came from, and workers that continue another worker's stream.

A worker's *role* is the stream it serves: its dataset state and, for iterable datasets,
the worker id the dataset sees. A resumed loader's worker `j` may play another role than
`j` so that the next batch comes from the stream that an uninterrupted run would have used.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

from torch.utils.data import _utils, get_worker_info


class Tagged(NamedTuple):
    """A collated batch, from the worker of role `role`, with `items` samples and what the
    main process records when it yields the batch (`payload`); or, with `items` PASS_END,
    no batch but the role's dataset state at the end of its pass."""

    batch: Any
    role: int
    items: int
    payload: Any


PASS_END = -1


def is_stateful(obj: Any) -> bool:
    """Whether `obj` saves and restores its state (torchdata's Stateful protocol)."""
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def state_now(obj: Any) -> Any:
    """`obj.state_dict()` by value: a copy that later changes to `obj` cannot reach (a
    dataset may return its live dict, which a worker keeps changing while the batch that
    carries it waits to be sent)."""
    return copy.deepcopy(obj.state_dict())


def play_role(shift: int, dataset: Any) -> int:
    """In a loader worker: take the role `(id + shift) % num_workers`; from then on
    `get_worker_info()` reports it as the id, and `dataset` (the user's copy, not the
    loader's wrapper) as the dataset. Returns the role."""
    info = get_worker_info()
    role = (info.id + shift) % info.num_workers
    _show_worker_info(id=role, dataset=dataset)
    return role


def _show_worker_info(**changes: Any) -> None:
    # WorkerInfo is frozen; torch's get_worker_info() returns this module global.
    _utils.worker._worker_info = dataclasses.replace(get_worker_info(), **changes)


class UserDatasetInit:
    """worker_init_fn of a map-style loader: `get_worker_info().dataset` becomes the user's
    dataset (the worker's copy the loader's wrapper fetches from), then the user's
    worker_init_fn runs, as under torch's DataLoader."""

    def __init__(self, user_fn: Callable[[int], None] | None) -> None:
        self._user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        wrapper = get_worker_info().dataset
        _show_worker_info(dataset=object.__getattribute__(wrapper, "_dataset"))
        if self._user_fn is not None:
            self._user_fn(worker_id)
