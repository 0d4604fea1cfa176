"""`ResumableDataLoader.regroup`: the rest of an epoch over another set of ranks, from the
global steps that count as consumed; the state stays the loader's own shard's (G1-G3)."""

from __future__ import annotations

import pytest

from dist_resume import ResumableDataLoader, ShardedStream


def _loader(**options) -> ResumableDataLoader:
    settings = {"batch_size": 2, "shuffle": False, "seed": 0, "rank": 0, "world_size": 1, **options}
    return ResumableDataLoader(list(range(20)), **settings)


def _batches(loader: ResumableDataLoader, count: int) -> list[list[int]]:
    iterator = iter(loader)
    return [next(iterator).tolist() for _ in range(count)]


def test_it_serves_the_rank_of_the_new_world_from_the_consumed_steps():
    loader = _loader()
    loader.regroup(1, 3)  # nothing consumed yet: rank 1 of 3 ranks of 2 samples
    assert _batches(loader, 2) == [[2, 3], [8, 9]]
    loader.regroup(0, 2, consumed=1)  # the second step (6 samples) was not committed
    assert (loader.rank, loader.world_size, loader.home_shard) == (0, 2, (0, 1))
    assert _batches(loader, 2) == [[6, 7], [10, 11]]


def test_steps_it_was_not_served_count_when_consumed():
    loader = _loader()
    loader.regroup(0, 4)
    loader.regroup(1, 2, consumed=2)  # two steps of 4 x 2 samples, trained by its peers
    assert _batches(loader, 1) == [[18, 19]]


def test_its_state_is_its_own_shards_at_the_consumed_position_and_resumes_anywhere():
    loader = _loader()
    loader.regroup(2, 3)
    assert _batches(loader, 2) == [[4, 5], [10, 11]]  # 2 steps of 6 consumed
    state = loader.state_dict()
    assert list(state) == ["elastic_guard__load_with_dist_resume_load_checkpoint", "plan", "rank_0"]
    resumed = [_loader(rank=rank, world_size=2) for rank in range(2)]
    for other in resumed:
        other.load_state_dict(state)
    assert [[batch.tolist() for batch in other] for other in resumed] == [[[12, 13], [16, 17]], [[14, 15], [18, 19]]]


def test_a_loaded_state_is_taken_at_the_own_shard():
    loader = _loader()
    loader.regroup(1, 2)
    source = _loader()
    _batches(source, 3)
    loader.load_state_dict(source.state_dict())
    assert (loader.rank, loader.world_size) == (0, 1)
    assert _batches(loader, 1) == [[6, 7]]


def test_consuming_the_last_step_moves_to_the_next_epoch():
    loader = _loader()
    loader.regroup(0, 5)
    loader.regroup(0, 1, consumed=2)  # 2 steps of 5 x 2: the whole epoch
    assert loader.epoch == 1
    assert loader.state_dict()["rank_0"]["progress"][7].item() == 1  # epoch


def test_more_steps_than_the_epoch_has_are_refused():
    loader = _loader()
    with pytest.raises(ValueError, match="consumed=4 global steps, but epoch 0 has 2 at world size 5"):
        loader.regroup(0, 5)
        loader.regroup(0, 1, consumed=4)


@pytest.mark.parametrize("options, what", [
    ({"seed": None}, "a seed drawn in this process"),
    ({"sampler": list(range(20))}, "a custom sampler or batch_sampler"),
    ({"in_order": False, "num_workers": 1}, "in_order=False"),
])
def test_loaders_it_cannot_regroup_are_refused(options, what):
    with pytest.raises(ValueError, match=f"regroup\\(\\) serves map-style datasets .*; this loader has {what}"):
        _loader(**options).regroup(0, 2)


def test_a_stream_is_refused(tmp_path):
    shard = tmp_path / "shard.txt"
    shard.write_text("a\nb\n")
    stream = ShardedStream([str(shard)], lambda file: iter(file.read().splitlines()), seed=0)
    loader = ResumableDataLoader(stream, batch_size=1, rank=0, world_size=1)
    with pytest.raises(ValueError, match="this loader has an IterableDataset"):
        loader.regroup(0, 2)


def test_skip_is_refused_once_regrouped():
    loader = _loader()
    loader.regroup(0, 2)
    with pytest.raises(ValueError, match="regroup\\(\\) moved this one"):
        loader.skip(1)
