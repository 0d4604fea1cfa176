"""G4 at the cost of what is drawn: generators are seeded only once a dataset draws from them,
exactly (a batch that drew unseeded is fetched again); the caller's randomness is left alone;
the sample's own generator (`sample_generator()`)."""

from __future__ import annotations

import random
import re
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dist_resume import ResumableDataLoader, sample_generator, sample_seed
from tests.datasets import Augmented, DrawsLate, Fetches, OwnGenerator, Squares


def _values(loader) -> dict[int, tuple]:
    return {index: tuple(row) for batch in loader for index, *row in zip(*(part.tolist() for part in batch))}


def test_a_dataset_that_starts_drawing_from_random_midway_is_exact_and_warned_once():
    reference = _values(ResumableDataLoader(DrawsLate(40, start=20), batch_size=4, seed=0, deterministic_transforms={"random"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        learnt = _values(ResumableDataLoader(DrawsLate(40, start=20), batch_size=4, seed=0))
    assert learnt == reference
    assert len({value for (value,) in reference.values() if value != -1.0}) == 20
    messages = [str(warning.message) for warning in caught]
    assert len(messages) == 1
    assert messages[0].startswith("ResumableDataLoader: the dataset drew from `random` at epoch 0, position 20, "
                                  "after 5 batches that did not; that batch was fetched again")
    # G4 across batch sizes, shuffling and workers, though each process learns it at another batch.
    shuffled = dict(reference=_values(ResumableDataLoader(DrawsLate(40, 20), batch_size=3, shuffle=True, seed=0,
                                                          deterministic_transforms={"random"})))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch_size, workers in ((5, 0), (7, 2)):
            shuffled[batch_size] = _values(ResumableDataLoader(DrawsLate(40, 20), batch_size=batch_size,
                                                               shuffle=True, seed=0, num_workers=workers))
    assert shuffled[5] == shuffled[7] == shuffled["reference"]


class SeedSeen(Dataset):
    """Draws nothing; returns the seed torch's generator was last seeded with."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int):
        return index, torch.initial_seed()


def test_a_dataset_that_draws_nothing_is_fetched_once_and_seeds_nothing():
    dataset = Fetches(30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [int(i) for batch in ResumableDataLoader(dataset, batch_size=4, shuffle=True) for i in batch] \
            == sorted(dataset.fetched, key=dataset.fetched.index)
    assert sorted(dataset.fetched) == list(range(30))
    torch.manual_seed(1234)
    assert set(_values(ResumableDataLoader(SeedSeen(), batch_size=5)).values()) == {(1234,)}


def test_the_sample_generator_is_the_samples_own():
    reference = _values(ResumableDataLoader(OwnGenerator(30), batch_size=4, shuffle=True, seed=3))
    assert _values(ResumableDataLoader(OwnGenerator(30), batch_size=7, shuffle=True, seed=3, num_workers=2)) == reference
    assert _values(ResumableDataLoader(OwnGenerator(30), batch_size=4, shuffle=True, seed=3,
                                       deterministic_transforms=False)) == reference
    assert len({value for values in reference.values() for value in values}) == 60  # every draw differs
    # Not the draws of torch's global generator seeded for the same sample.
    assert {i: v[0] for i, v in reference.items()} != {i: v[0] for i, v in _augmented(batch_size=4, seed=3).items()}
    with pytest.raises(RuntimeError, match=re.escape("sample_seed()/sample_generator() are only valid inside")):
        sample_generator()
    with pytest.raises(RuntimeError, match=re.escape("sample_seed()/sample_generator() are only valid inside")):
        sample_seed()


def _augmented(**kwargs) -> dict[int, tuple]:
    values = {}
    for batch in ResumableDataLoader(Augmented(30), shuffle=True, **kwargs):
        for i, index in enumerate(batch["index"].tolist()):
            values[index] = (batch["torch"][i].item(), batch["random"][i].item(), batch["numpy"][i].item())
    return values


def _training_step_draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), float(np.random.rand()), float(np.random.standard_normal())


def _seed_caller(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    np.random.standard_normal()  # leaves numpy's cached Gaussian set


@pytest.mark.parametrize("dataset", [Augmented(20), DrawsLate(20, start=6)], ids=["draws", "draws-midway"])
def test_the_callers_generators_are_untouched_at_0_workers(dataset):
    """Issue 10 point 9: the training step's randomness does not depend on the loader's fetches:
    it is what it is beside torch's DataLoader over samples that draw nothing (which, like
    ours, draws its workers' base seed from torch's generator at iter())."""
    expected = {}
    for seed in (1, 2):
        _seed_caller(seed)
        expected[seed] = [_training_step_draws() for _batch in DataLoader(Squares(20), batch_size=4)]
    assert expected[1] != expected[2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in (1, 2):
            loader = ResumableDataLoader(dataset, batch_size=4)
            _seed_caller(seed)
            assert [_training_step_draws() for _batch in loader] == expected[seed]


def test_numpy_cached_gaussian_is_noticed():
    """A batch whose only numpy draw takes the Gaussian numpy cached for the caller is exact too."""

    class OneGaussian(Dataset):
        def __len__(self) -> int:
            return 12

        def __getitem__(self, index: int):
            return index, float(np.random.standard_normal()) if index == 9 else 0.0

    reference = _values(ResumableDataLoader(OneGaussian(), batch_size=4, seed=0, deterministic_transforms={"numpy"}))
    _seed_caller(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _values(ResumableDataLoader(OneGaussian(), batch_size=4, seed=0)) == reference


def test_deterministic_transforms_names_the_generators_seeded():
    torch_only = [_augmented(batch_size=b, seed=4, deterministic_transforms={"torch"}) for b in (3, 5)]
    assert [v[0] for v in torch_only[0].values()] == [v[0] for v in torch_only[1].values()]
    random.seed(0)
    first = _augmented(batch_size=3, seed=4, deterministic_transforms={"torch"})
    random.seed(1)
    second = _augmented(batch_size=3, seed=4, deterministic_transforms={"torch"})
    assert [v[1] for v in first.values()] != [v[1] for v in second.values()]  # `random` is the caller's
    with pytest.raises(ValueError, match=re.escape("deterministic_transforms: unknown generators ['jax']")):
        ResumableDataLoader(Augmented(4), deterministic_transforms={"torch", "jax"})
    with pytest.raises(ValueError, match=re.escape("deterministic_transforms must be True, False or a set of")):
        ResumableDataLoader(Augmented(4), deterministic_transforms="torch")


class DrawsDependOnDraws(Dataset):
    """Draws from numpy only when its draw from `random` says so: a seeded fetch may take
    another path than the unseeded one."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int):
        if index < 8:
            return index, 0.0
        return index, float(np.random.rand()) if random.random() < 0.5 else -1.0


def test_a_generator_first_drawn_by_the_seeded_fetch_again_is_noticed():
    reference = _values(ResumableDataLoader(DrawsDependOnDraws(), batch_size=1, seed=1,
                                            deterministic_transforms={"random", "numpy"}))
    assert reference[8] != (-1.0,)  # seeded, the first sample that draws takes the numpy path
    for caller_seed in range(6):  # unseeded, it skips it for about half the caller's seeds
        random.seed(caller_seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert _values(ResumableDataLoader(DrawsDependOnDraws(), batch_size=1, seed=1)) == reference
