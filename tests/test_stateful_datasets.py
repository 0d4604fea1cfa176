"""Stateful samplers and datasets (torchdata's tutorial examples) and other IterableDatasets:
exact resume (G1) through the loader's state and through a DCP checkpoint, clear refusals (G6)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from dist_resume import (
    ResumableDataLoader,
    ResumeStateError,
    load_checkpoint,
    save_checkpoint,
)

from .test_loader import assert_same_batches
from .tutorial_datasets import Counting, EpochCounting, MyIterableDataset, MySampler, NoisyRange


def _map_loader(num_workers: int) -> ResumableDataLoader:
    # deterministic_transforms=False: the noise comes from each worker's own generator,
    # so only the dataset's saved state makes the resumed batches equal.
    return ResumableDataLoader(NoisyRange(5, 1, 1), sampler=MySampler(5, 1, 10), batch_size=2,
                               num_workers=num_workers, deterministic_transforms=False)


def _iterable_loader(num_workers: int, snapshot_every: int = 2) -> ResumableDataLoader:
    return ResumableDataLoader(MyIterableDataset(13, 0), batch_size=2, num_workers=num_workers,
                               snapshot_every=snapshot_every)


def _split(loader: ResumableDataLoader, stop: int):
    """The uninterrupted batches after batch `stop`, and the state saved there."""
    iterator = iter(loader)
    for _ in range(stop):
        next(iterator)
    state = loader.state_dict()
    return list(iterator), state


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop", [0, 3, 4])
def test_tutorial_map_style_sampler_and_noisy_dataset_resume_exactly(num_workers, stop):
    rest, state = _split(_map_loader(num_workers), stop)
    resumed = _map_loader(num_workers)
    resumed.load_state_dict(state)
    assert len(rest) == 5 - stop
    assert_same_batches(rest, list(resumed))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("snapshot_every", [1, 2, 16])
@pytest.mark.parametrize("stop", [0, 1, 3, 5])
def test_tutorial_iterable_dataset_resumes_exactly(num_workers, snapshot_every, stop):
    """13 items over 2 workers: streams of 4 and 3 batches, so the cycle meets an exhausted
    worker; the uninterrupted order is torch's."""
    loader = _iterable_loader(num_workers, snapshot_every)
    expected = list(DataLoader(MyIterableDataset(13, 0), batch_size=2, num_workers=num_workers))
    head = []
    iterator = iter(loader)
    for _ in range(stop):
        head.append(next(iterator))
    state = loader.state_dict()
    rest = list(iterator)
    assert_same_batches(head + rest, expected)
    resumed = _iterable_loader(num_workers, snapshot_every)
    resumed.load_state_dict(state)
    assert_same_batches(list(resumed), rest)


def test_iterable_epochs_continue_after_a_resume():
    loader = _iterable_loader(2)
    first, state = _split(loader, 2)
    second = list(loader)
    resumed = _iterable_loader(2)
    resumed.load_state_dict(state)
    assert_same_batches(list(resumed) + list(resumed), first + second)
    assert resumed.epoch == 2


def _pairs(batches) -> list[tuple[int, int]]:
    return [(int(item), int(epoch)) for items, epochs in batches for item, epoch in zip(items, epochs)]


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_copies_keep_their_state_across_epochs_exactly_when_workers_persist(persistent):
    """Under torch's DataLoader a persistent worker's dataset copy keeps what its passes
    changed (here: a pass counter), while fresh workers start from the loader's dataset."""
    def make(cls):
        return cls(EpochCounting(10), batch_size=2, num_workers=2, persistent_workers=persistent)

    torch_loader = make(DataLoader)
    expected = [_pairs(torch_loader) for _ in range(3)]
    assert {epoch for _, epoch in expected[2]} == ({2} if persistent else {0})
    loader = make(ResumableDataLoader)
    assert [_pairs(loader) for _ in range(3)] == expected


@pytest.mark.parametrize("stop", [0, 1, 3, 5])
def test_persistent_workers_state_carried_across_epochs_resumes_exactly(stop):
    """A state taken anywhere (`stop` batches into epoch 1; 0: at the end of epoch 0) resumes
    the rest of that epoch and the next with the passes' counters an uninterrupted run has."""
    def make():
        return ResumableDataLoader(EpochCounting(10), batch_size=2, num_workers=2, persistent_workers=True,
                                   snapshot_every=2)

    loader = make()
    list(loader)
    rest, state = _split(loader, stop)
    rest = _pairs(rest) + _pairs(loader)
    resumed = make()
    iterator = iter(resumed)
    next(iterator)  # a started loader: the state replaces what it did
    resumed.load_state_dict(state)
    assert _pairs(resumed) + _pairs(resumed) == rest
    assert {epoch for _, epoch in rest[-4:]} == {2}


def test_a_pass_left_before_its_end_with_persistent_workers_says_its_state_is_not_carried():
    """A loop that takes exactly the pass's batches (zip with a count) never asks for the
    end, so the workers' end-of-pass states are still in flight: the next pass cannot carry
    them and says so, rather than silently differing from a persistent worker's copy."""
    loader = ResumableDataLoader(EpochCounting(10), batch_size=2, num_workers=2, persistent_workers=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(zip(range(6), loader))) == 6  # every batch of the pass
    message = ("ResumableDataLoader: a pass over EpochCounting was left before its end, so the end-of-pass state of "
               "workers [0, 1] is unknown; their next pass starts from the state their last completed pass ended "
               "with, not from where a persistent worker's copy stands (iterate each pass to its end to carry it)")
    with pytest.warns(UserWarning, match=re.escape(message)):
        second = _pairs(loader)
    assert {epoch for _, epoch in second} == {0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert {epoch for _, epoch in _pairs(loader)} == {1}  # the second pass ran to its end


@pytest.mark.parametrize("num_workers", [0, 2])
def test_tutorial_examples_resume_through_a_dcp_checkpoint(tmp_path, num_workers):
    for make in (_map_loader, _iterable_loader):
        loader = make(num_workers)
        iterator = iter(loader)
        for _ in range(3):
            next(iterator)
        url = str(tmp_path / f"{make.__name__}-{num_workers}")
        save_checkpoint({"loader": loader}, url, step=3)
        rest = list(iterator)
        resumed = make(num_workers)
        assert load_checkpoint({"loader": resumed}, url) == 3
        assert_same_batches(list(resumed), rest)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_without_state_resumes_by_replay_and_says_so(num_workers):
    def make():
        return ResumableDataLoader(Counting(11), batch_size=3, num_workers=num_workers)

    rest, state = _split(make(), 2)
    resumed = make()
    message = (
        "ResumableDataLoader: Counting has no state_dict/load_state_dict, so each worker resumes by replaying "
        "its stream and discarding the 6 items already consumed"
    )
    with pytest.warns(UserWarning, match=f"^{re.escape(message)}$"):
        resumed.load_state_dict(state)
    assert_same_batches(list(resumed), rest)


def test_iterable_refuses_another_num_workers_or_world_size():
    _, state = _split(_iterable_loader(2), 1)
    message = (
        "loader state was saved at world size 1 with num_workers=2; this loader has world size 1 with "
        "num_workers=0: an IterableDataset other than ShardedStream resumes only with the saved world size and num_workers"
    )
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        _iterable_loader(0).load_state_dict(state)
    other = ResumableDataLoader(MyIterableDataset(13, 0), batch_size=2, num_workers=2, rank=0, world_size=2)
    with pytest.raises(ResumeStateError, match="^loader state was saved at world size 1 with num_workers=2; this loader has world size 2 with"):
        other.load_state_dict(state)


def test_stateful_map_dataset_refuses_another_num_workers():
    _, state = _split(_map_loader(2), 1)
    message = (
        "loader state holds dataset states of 2 worker copies per rank at world size 1; this loader has 1 at "
        "world size 1: a stateful map-style dataset resumes only with the saved world size and num_workers"
    )
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        _map_loader(0).load_state_dict(state)


def test_map_state_refused_by_an_iterable_loader():
    _, state = _split(_map_loader(0), 1)
    with pytest.raises(ResumeStateError, match="^loader state was saved for a dataset of 5 samples"):
        _iterable_loader(0).load_state_dict(state)


@pytest.mark.parametrize("bad, error, message", [
    (0, ValueError, "snapshot_every must be an int >= 1, got 0"),
    (-1, ValueError, "snapshot_every must be an int >= 1, got -1"),
    (1.5, TypeError, "snapshot_every must be an int, got float 1.5"),
    (True, TypeError, "snapshot_every must be an int, got bool True"),
])
def test_snapshot_every_must_be_a_positive_int(bad, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        _iterable_loader(0, snapshot_every=bad)


def test_worker_init_fn_sees_the_role_and_the_users_dataset():
    """After a resume, worker 0 may continue role 1's stream: its worker_init_fn and the
    dataset see id 1."""

    def init(worker_id):
        info = torch.utils.data.get_worker_info()
        assert info.id == worker_id and isinstance(info.dataset, MyIterableDataset)

    loader = ResumableDataLoader(MyIterableDataset(13, 0), batch_size=2, num_workers=2, worker_init_fn=init)
    rest, state = _split(loader, 1)
    resumed = ResumableDataLoader(MyIterableDataset(13, 0), batch_size=2, num_workers=2, worker_init_fn=init)
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seen = list(resumed)
    assert_same_batches(seen, rest)
