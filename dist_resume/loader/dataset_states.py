"""The state of a map-style dataset that has `state_dict`/`load_state_dict`, per worker.

Each worker holds its own copy of the dataset (for example its random generator). Batch
`k` of an epoch is fetched by the worker of role `k % roles`: the worker returns the
dataset's state after the batch with it, the main process keeps it when it yields the
batch, and the first request that reaches each worker in a new iteration carries its
role's state to load. So a resume, or a new `iter()` after prefetching workers ran ahead,
continues every copy from its last yielded batch (G1). Dataset states are matched to
workers, so they resume only with the saved world size and `num_workers`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from dist_resume.state.fields import ResumeStateError
from dist_resume.workers.roles import Tagged, state_now


class TaggingCollate:
    """collate_fn of a stateful dataset's requests: collates the samples a worker tagged."""

    def __init__(self, collate_fn) -> None:
        self.collate_fn = collate_fn

    def __call__(self, fetched: list[Tagged]) -> Tagged:
        (tagged,) = fetched
        return tagged._replace(batch=self.collate_fn(tagged.batch))


class DatasetStates:
    """Per worker role: the dataset state after that role's last yielded batch, at first
    the state of `dataset` when the loader first needs it (a first `iter()` or
    `state_dict()`, never its constructor), which every worker's copy starts from."""

    def __init__(self, dataset: Any, num_workers: int) -> None:
        self.roles = max(num_workers, 1)
        self._dataset = dataset
        self._initial: list[Any] | None = None

    @property
    def _states(self) -> list[Any]:
        if self._initial is None:
            self._initial = [state_now(self._dataset)] * self.roles
        return self._initial

    def role(self, batch: int) -> int:
        return batch % self.roles

    def restore(self, role: int) -> Any:
        return self._states[role]

    def yielded(self, inner: Iterator[Tagged]) -> Iterator[Any]:
        """The batches of `inner`, keeping each one's dataset state as it is handed on."""
        for tagged in inner:
            self._states[tagged.role] = tagged.payload
            yield tagged.batch

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"roles": torch.tensor([self.roles], dtype=torch.int64)}
        for role, snapshot in enumerate(self._states):
            state[f"snapshot_{role}"] = snapshot
        return state

    def accept(self, entry: Mapping[str, Any] | None, saved_world_size: int, world_size: int) -> Callable[[], None]:
        """Check a rank's saved dataset states; return what continues every role from them."""
        if entry is None:
            raise ResumeStateError("loader state holds no dataset state; this loader's dataset has state_dict/load_state_dict")
        roles = int(entry["roles"][0])
        if (roles, saved_world_size) != (self.roles, world_size):
            raise ResumeStateError(
                f"loader state holds dataset states of {roles} worker copies per rank at world size {saved_world_size}; "
                f"this loader has {self.roles} at world size {world_size}: a stateful map-style dataset resumes only "
                "with the saved world size and num_workers"
            )
        initial = [entry[f"snapshot_{role}"] for role in range(self.roles)]

        def adopt() -> None:
            self._initial = initial

        return adopt
