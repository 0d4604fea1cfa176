"""DataPipes as streams: one shuffled order per epoch from the loader's seed, split over
ranks and workers by their `sharding_filter`, as torch's DataLoader splits them."""

from __future__ import annotations

import warnings

import pytest
import torch.utils.data.datapipes as dp

from dist_resume import ResumableDataLoader


def _pipe():
    return dp.iter.IterableWrapper(range(60)).shuffle(buffer_size=16).sharding_filter()


def _items(loader) -> list[int]:
    return [int(item) for item in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_item_once_per_epoch_in_an_order_of_the_seed_and_epoch(num_workers):
    loader = ResumableDataLoader(_pipe(), batch_size=None, num_workers=num_workers, seed=3)
    epochs = [_items(loader) for _ in range(2)]
    assert all(sorted(epoch) == list(range(60)) for epoch in epochs)
    assert epochs[0] != epochs[1]
    again = ResumableDataLoader(_pipe(), batch_size=None, num_workers=num_workers, seed=3)
    assert [_items(again) for _ in range(2)] == epochs


def test_ranks_split_the_pipe_between_them():
    by_rank = [_items(ResumableDataLoader(_pipe(), batch_size=None, num_workers=2, seed=3, rank=rank, world_size=2))
               for rank in range(2)]
    assert sorted(by_rank[0] + by_rank[1]) == list(range(60))
    assert by_rank[0] and by_rank[1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_midway_continues_with_the_same_items(num_workers):
    """A DataPipe has no state_dict: the resume replays each worker's share of the same
    seeded order and discards what was consumed (with the loader's warning), exactly."""
    loader = ResumableDataLoader(_pipe(), batch_size=4, num_workers=num_workers, seed=3)
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(5)]
    state = loader.state_dict()
    rest = [batch.tolist() for batch in iterator]
    resumed = ResumableDataLoader(_pipe(), batch_size=4, num_workers=num_workers, seed=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.load_state_dict(state)
    assert any("replaying its stream" in str(warning.message) for warning in caught)
    assert [batch.tolist() for batch in resumed] == rest
    assert sorted(item for batch in head + rest for item in batch) == list(range(60))


def test_a_pipe_without_sharding_filter_read_by_two_workers_warns():
    """Its items come twice an epoch (as under torch's DataLoader): never silently."""
    pipe = dp.iter.IterableWrapper(range(10))
    loader = ResumableDataLoader(pipe, batch_size=None, num_workers=2, seed=3)
    with pytest.warns(UserWarning, match=r"no sharding_filter, so each of its 2 readers .* every item comes 2 times"):
        items = _items(loader)
    assert sorted(items) == sorted(list(range(10)) * 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sorted(_items(ResumableDataLoader(_pipe(), batch_size=None, num_workers=2, seed=3))) == list(range(60))
        assert sorted(_items(ResumableDataLoader(dp.iter.IterableWrapper(range(10)), batch_size=None))) == list(range(10))
