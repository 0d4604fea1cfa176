"""A stand-in for the data loader that follows its checkpoint contract (dist_resume.state):
a replicated guard and plan, one ``rank_<r>`` entry per rank of fields the library declares
(`dist_resume.checkpoint.entry_fields`): its remaining positions as the shared ``progress``
and a nested plain-data value as its own ``sampler``; and a ``load_state_dict`` that
receives every saved rank's shared fields and re-partitions the remaining positions over
the current world size."""

from __future__ import annotations

from typing import Any

import torch

from dist_resume.state.fields import ELASTIC_GUARD_KEY


class StandInLoader:
    def __init__(self, dataset_len: int, rank: int, world_size: int) -> None:
        self.dataset_len = dataset_len
        self.rank = rank
        self.world_size = world_size
        self.remaining = list(range(rank, dataset_len, world_size))
        self.consumed: list[int] = []

    def next_batch(self, size: int) -> list[int]:
        batch, self.remaining = self.remaining[:size], self.remaining[size:]
        self.consumed += batch
        return batch

    def _plan(self) -> torch.Tensor:
        return torch.tensor([self.dataset_len, 0], dtype=torch.int64)

    def state_dict(self) -> dict[str, Any]:
        plan = self._plan()
        return {
            ELASTIC_GUARD_KEY: torch.zeros(self.world_size, len(plan), dtype=torch.int64),
            "plan": plan,
            f"rank_{self.rank}": {
                "progress": torch.tensor(self.remaining, dtype=torch.int64),
                "sampler": {"name": "stand-in", "consumed": len(self.consumed)},
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved_len = int(state["plan"][0])
        if saved_len != self.dataset_len:
            raise ValueError(
                f"loader state is for a dataset of {saved_len} samples, this dataset has {self.dataset_len}"
            )
        ranks = [key for key in state if key.startswith("rank_")]
        assert len(ranks) == state[ELASTIC_GUARD_KEY].shape[0], "every saved rank must be loaded"
        own = state.get(f"rank_{self.rank}")
        assert own is None or own["sampler"]["name"] == "stand-in"
        remaining = sorted(int(p) for key in ranks for p in state[key]["progress"])
        self.remaining = remaining[self.rank :: self.world_size]
