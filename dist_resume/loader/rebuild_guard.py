"""The sampler and batch sampler a `ResumableDataLoader` shows for torch's sake.

With its own epoch order the loader never iterates torch's default samplers (they are
unsharded and know no position). Code that rebuilds a DataLoader from them (accelerate's
``prepare`` without ``attach``, its ``skip_first_batches``, HF Trainer's mid-epoch resume)
would train another order on every rank, silently; iterating them is therefore an error that names the recipe, while their
length and attributes stay torch's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class RebuildGuard:
    """``inner`` (torch's default sampler or batch sampler), except that iterating it raises."""

    def __init__(self, inner: Any, what: str) -> None:
        self._inner = inner
        self._what = what

    def __len__(self) -> int:
        return len(self._inner)

    def __iter__(self) -> Iterator[Any]:
        raise ValueError(
            f"ResumableDataLoader: its batches come from its own epoch order and position, not from its {self._what}: "
            "a DataLoader rebuilt from it (accelerate's prepare without attach, or its skip_first_batches; HF "
            "Trainer's mid-epoch resume) would train another order, silently. With accelerate, attach the loader "
            "(dist_resume.integrations.accelerate.attach) before prepare; resume it with load_state_dict; under HF "
            "Trainer, put dist_resume.integrations.transformers.ResumableTrainerMixin before Trainer (it turns "
            "Trainer's batch skipping off and saves the loader's state with each checkpoint)"
        )

    def __getattr__(self, name: str) -> Any:
        # never for the copy and pickle protocols, nor before __init__ ran (a copy being built)
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)
