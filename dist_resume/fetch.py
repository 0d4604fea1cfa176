"""What a loader worker runs for one batch request: the user's dataset, each sample
fetched under its own seed (G4)."""

from __future__ import annotations

from typing import Any, NamedTuple

from torch.utils.data import Dataset

from .seeds import SampleSeeder, derive_seed, derive_seeds
from .worker_roles import Tagged, is_stateful, state_now


class BatchRequest(NamedTuple):
    """What the main process asks a worker to fetch: indices, and the epoch positions
    they sit at (which seed their randomness); for a stateful dataset, the worker role
    that fetches them and the dataset state to load first (`restore`)."""

    epoch: int
    positions: list[int]
    indices: list[int]
    role: int = 0
    restore: Any = None


class SeededDataset(Dataset):
    """The user's dataset, fetched by `BatchRequest`, each sample under its own seed (G4).

    Attribute reads and writes go through to the user's dataset, so code that reaches
    it through `get_worker_info().dataset` keeps working.
    """

    def __init__(self, dataset: Dataset, seed: int, deterministic: bool) -> None:
        object.__setattr__(self, "_dataset", dataset)
        object.__setattr__(self, "_seed", seed)
        object.__setattr__(self, "_deterministic", deterministic)
        object.__setattr__(self, "_seeder", SampleSeeder())
        object.__setattr__(self, "_batched", callable(getattr(dataset, "__getitems__", None)))
        object.__setattr__(self, "_stateful", is_stateful(dataset))

    def __getitems__(self, request: BatchRequest) -> list[Any]:
        if not self._stateful:
            return self._fetch(request)
        if request.restore is not None:
            self._dataset.load_state_dict(request.restore)
        samples = self._fetch(request)
        return [Tagged(samples, request.role, len(samples), state_now(self._dataset))]

    def _fetch(self, request: BatchRequest) -> list[Any]:
        if self._batched:
            # One call fetches the whole batch, so its randomness is seeded per batch:
            # reproducible for the same batch, not per sample.
            if self._deterministic and request.positions:
                self._seeder.seed(derive_seed(self._seed, request.epoch, request.positions[0]))
            return self._dataset.__getitems__(request.indices)
        if not self._deterministic:
            return [self._dataset[index] for index in request.indices]
        samples = []
        for sample_seed, index in zip(derive_seeds(self._seed, request.epoch, request.positions), request.indices):
            self._seeder.seed(sample_seed)
            samples.append(self._dataset[index])
        return samples

    def __getitem__(self, index: int) -> Any:
        return self._dataset[index]

    def __len__(self) -> int:
        return len(self._dataset)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_dataset"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._dataset, name, value)

    def __getstate__(self) -> dict[str, Any]:
        names = ("_dataset", "_seed", "_deterministic", "_batched", "_stateful")
        return {name: object.__getattribute__(self, name) for name in names}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "_seeder", SampleSeeder())


class SingleSample:
    """collate for `batch_size=None`: each request holds one sample, collated alone."""

    def __init__(self, collate_fn) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: list[Any]) -> Any:
        return self.collate_fn(samples[0])
