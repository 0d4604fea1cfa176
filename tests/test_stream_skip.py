"""`skip` on streams (issue 22 point 2): a ShardedStream, or a Mixture of them, passes over
the next global steps by moving its epoch position; its readers read past them. Skipped
items are never trained, also after a resume at another world size (G2), and the other
global batches stay those of the uninterrupted run (G3)."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset

from dist_resume import ResumableDataLoader

from .merged_states import merged_from
from .stream_jobs import all_items, make_stream, write_shards
from .stream_mixture_jobs import GLOBAL_BATCH as MIXTURE_BATCH
from .stream_mixture_jobs import job as mixture_job
from .stream_mixture_jobs import make_mixture, write_sources

GLOBAL_BATCH = 6


@pytest.fixture
def urls(tmp_path) -> list[str]:
    return write_shards(str(tmp_path))


def _loaders(urls: list[str], world_size: int, num_workers: int, state: dict[str, Any] | None
             ) -> list[ResumableDataLoader]:
    loaders = []
    for rank in range(world_size):
        loader = ResumableDataLoader(make_stream(urls, canonical_streams=2), batch_size=GLOBAL_BATCH // world_size,
                                     num_workers=num_workers, rank=rank, world_size=world_size)
        if state is not None:
            loader.load_state_dict(state)
        loaders.append(loader)
    return loaders


def _steps(loaders: list[ResumableDataLoader], steps: int | None) -> list[list[int]]:
    per_rank = [[batch.tolist() for batch in itertools.islice(loader, steps)] for loader in loaders]
    assert len({len(batches) for batches in per_rank}) == 1
    return [sum((batches[step] for batches in per_rank), []) for step in range(len(per_rank[0]))]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_skip_survives_a_resume_at_another_world_size_and_trains_nothing_it_passed_over(urls, num_workers):
    uninterrupted = _steps(_loaders(urls, 1, 0, None), None)
    loaders = _loaders(urls, 2, num_workers, None)
    trained = _steps(loaders, 2)
    assert [loader.skip(3) for loader in loaders] == [3, 3]
    trained += _steps(loaders, 1)
    resumed = _loaders(urls, 3, 1, merged_from(loaders))
    assert [str(r) for r in resumed[0].skipped] == [
        "epoch 0: global batches 2 to 4 (3), positions 12 to 29 (18)"]
    trained += _steps(resumed, None)
    assert trained == uninterrupted[:2] + uninterrupted[5:]
    skipped = {item for step in uninterrupted[2:5] for item in step}
    assert skipped.isdisjoint(item for step in trained for item in step)
    padding = -len(all_items()) % GLOBAL_BATCH
    assert sorted(skipped | {item for step in trained for item in step}) == all_items()
    assert sum(len(step) for step in trained) + len(skipped) == len(all_items()) + padding


def test_a_skip_past_the_epochs_end_stops_at_it_and_says_so(urls):
    (loader,) = _loaders(urls, 1, 0, None)
    steps = len(loader)
    list(itertools.islice(loader, steps - 2))
    message = (f"ResumableDataLoader.skip(5) stopped at the end of epoch 0: 2 global batches were left in it and "
               "skipped; the next epoch is not skipped into")
    with pytest.warns(UserWarning, match=f"^{re.escape(message)}$"):
        assert loader.skip(5) == 2
    assert list(loader) == []
    assert loader.epoch == 1 and len(list(loader)) == steps


def test_a_mixture_of_streams_skips_global_steps_too(tmp_path):
    urls = write_sources(str(tmp_path))
    reference, _ = mixture_job(make_mixture(urls, canonical_streams=4), 1, 0, None, None)
    mixture = make_mixture(urls, canonical_streams=4)
    loaders = [ResumableDataLoader(mixture, batch_size=MIXTURE_BATCH // 2, rank=rank, world_size=2, shuffle=True,
                                   seed=3) for rank in range(2)]
    trained = _steps(loaders, 1)
    assert [loader.skip(2) for loader in loaders] == [2, 2]
    steps, _ = mixture_job(make_mixture(urls, canonical_streams=4), 3, 1, merged_from(loaders), None)
    assert trained + steps == reference[:1] + reference[3:]


def test_a_stream_without_positions_cannot_skip():
    class Numbers(IterableDataset):
        def __iter__(self):
            return iter(range(6))

    message = ("skip() supports a map-style dataset, a Mixture or a ShardedStream (and Mixtures of them) in the "
               "loader's own order; this loader reads an IterableDataset other than a ShardedStream, whose stream "
               "has no positions to skip to")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ResumableDataLoader(Numbers(), batch_size=2).skip(1)
    assert torch.equal(next(iter(ResumableDataLoader(Numbers(), batch_size=2))), torch.tensor([0, 1]))
