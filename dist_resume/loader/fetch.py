"""What a loader worker runs for one batch request: the user's dataset, each sample
fetched under its own seed (G4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from torch.utils.data import Dataset

from dist_resume.randomness.global_generators import NAMES, generators
from dist_resume.randomness.per_sample import CONTEXT, SampleRandomness
from dist_resume.randomness.seeds import derive_seed, derive_seeds
from dist_resume.workers.roles import Tagged, is_stateful, state_now


class BatchRequest(NamedTuple):
    """What the main process asks a worker to fetch: indices, and the epoch positions
    they sit at (which seed their randomness); for a stateful dataset, the worker role
    that fetches them and the dataset state to load first (`restore`)."""

    epoch: int
    positions: Sequence[int]
    indices: list[int]
    role: int = 0
    restore: Any = None

    def wire(self) -> tuple:
        """The request as a worker receives it: builtins only, the positions as their first
        one when consecutive. Pickled for every batch, where a class or a `range` to look up
        costs more than the rest of the request."""
        positions = self.positions
        first = positions.start if type(positions) is range and positions.step == 1 else list(positions)
        if self.role == 0 and self.restore is None:
            return self.epoch, first, self.indices
        return self.epoch, first, self.indices, self.role, self.restore

    @classmethod
    def unwire(cls, wire: tuple) -> BatchRequest:
        epoch, first, indices, *rest = wire
        positions = range(first, first + len(indices)) if type(first) is int else first
        return cls(epoch, positions, indices, *rest)


class SeededDataset(Dataset):
    """The user's dataset, fetched by `BatchRequest`, each sample under its own seed (G4).

    Attribute reads and writes go through to the user's dataset, so code that reaches
    it through `get_worker_info().dataset` keeps working.
    """

    def __init__(self, dataset: Dataset, seed: int, choice: bool | frozenset[str]) -> None:
        object.__setattr__(self, "_dataset", dataset)
        object.__setattr__(self, "_seed", seed)
        object.__setattr__(self, "_choice", choice)
        object.__setattr__(self, "_batched", callable(getattr(dataset, "__getitems__", None)))
        object.__setattr__(self, "_stateful", is_stateful(dataset))
        object.__setattr__(self, "_randomness", None)  # per process, made at its first fetch
        if choice:
            generators(NAMES)  # found once here, so that forked workers need not look again

    def __getitems__(self, request: BatchRequest | tuple) -> list[Any]:
        if type(request) is tuple:
            request = BatchRequest.unwire(request)
        if not self._stateful:
            return self._fetch(request)
        if request.restore is not None:
            self._dataset.load_state_dict(request.restore)
        samples = self._fetch(request)
        return [Tagged(samples, request.role, len(samples), state_now(self._dataset))]

    def _fetch(self, request: BatchRequest) -> list[Any]:
        randomness = self._randomness or self._start_randomness()
        if not randomness.quiet or randomness.own:
            return self._seeded_fetch(request, randomness)
        # The common case, kept short: nothing to seed, the probed generators watched.
        snapshot = randomness.snapshot
        before = snapshot() if snapshot is not None else None
        dataset = self._dataset
        context = CONTEXT
        context.fetching = True
        try:
            samples = dataset.__getitems__(request.indices) if self._batched else [dataset[index] for index in request.indices]
        finally:
            context.fetching = False
        if context.asked or (before is not None and snapshot() != before):
            return self._settle(request, randomness, before, samples)
        randomness.clean_batches += 1
        return samples

    def _start_randomness(self) -> SampleRandomness:
        randomness = SampleRandomness(self._choice, refetch=not self._stateful)
        object.__setattr__(self, "_randomness", randomness)
        return randomness

    def _seeded_fetch(self, request: BatchRequest, randomness: SampleRandomness) -> list[Any]:
        snapshot = randomness.snapshot
        before = snapshot() if snapshot is not None else None
        samples = self._samples(request, randomness)
        if before is not None or CONTEXT.asked:
            samples = self._settle(request, randomness, before, samples)
        return samples

    def _settle(self, request: BatchRequest, randomness: SampleRandomness, before: Any, samples: list[Any]) -> list[Any]:
        return randomness.settle(before or [], samples, lambda: self._samples(request, randomness),
                                 lambda: f"epoch {request.epoch}, position {request.positions[0]}")

    def _samples(self, request: BatchRequest, randomness: SampleRandomness) -> list[Any]:
        """The batch with each sample seeded (its seed in the context when `randomness.own`)."""
        dataset = self._dataset
        context = CONTEXT
        seeders = [generator.seed for generator in randomness.seeded]
        outer = context.seed
        try:
            if self._batched:
                # One call fetches the whole batch, so its randomness is seeded per batch:
                # reproducible for the same batch, not per sample.
                if not len(request.positions):
                    return dataset.__getitems__(request.indices)
                context.seed = derive_seed(self._seed, request.epoch, request.positions[0])
                context.generator_seed = None
                for seed in seeders:
                    seed(context.seed)
                return dataset.__getitems__(request.indices)
            samples = []
            for sample_seed, index in zip(derive_seeds(self._seed, request.epoch, request.positions), request.indices):
                for seed in seeders:
                    seed(sample_seed)
                context.seed, context.generator_seed = sample_seed, None
                samples.append(dataset[index])
            return samples
        finally:
            context.seed = outer

    def __getitem__(self, index: int) -> Any:
        return self._dataset[index]

    def __len__(self) -> int:
        return len(self._dataset)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_dataset"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._dataset, name, value)

    def __getstate__(self) -> dict[str, Any]:
        names = ("_dataset", "_seed", "_choice", "_batched", "_stateful")
        return {name: object.__getattribute__(self, name) for name in names}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_randomness", None)


class SingleSample:
    """collate for `batch_size=None`: each request holds one sample, collated alone."""

    def __init__(self, collate_fn) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: list[Any]) -> Any:
        return self.collate_fn(samples[0])
