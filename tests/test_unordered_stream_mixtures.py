"""in_order=False over a Mixture with ShardedStream sources (and a map-style one): each
worker reads whole batches of its own run of the mixture's positions and the loader hands on
whichever arrives first; a resume at the same or another num_workers, world size or batch
size trains every position of the epoch exactly once, so each source's items once per
source-epoch (G1 for in_order=False, G2); per-item seeds do not depend on who reads (G4)."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from typing import Any

import pytest
import torch

from dist_resume import Mixture, ResumableDataLoader, ResumeStateError
from dist_resume.mixtures.inspection import describe
from dist_resume.state.saved import decode
from dist_resume.streams import ShardedStream

from .stream_jobs import read_jsonl, run_ranks
from .stream_mixture_jobs import (
    GLOBAL_BATCH, LENGTH, MAP_BASE, assert_once_per_source_epoch, make_mixture, source_of, write_sources,
)


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> dict[str, list[str]]:
    return write_sources(str(tmp_path_factory.mktemp("unordered_stream_mixture")))


def loader_of(mixture: Mixture, rank: int, world_size: int, num_workers: int, *, in_order: bool = False,
              batch_size: int | None = None, **options: Any) -> ResumableDataLoader:
    return ResumableDataLoader(mixture, batch_size=batch_size or GLOBAL_BATCH // world_size, num_workers=num_workers,
                               rank=rank, world_size=world_size, shuffle=True, seed=3, in_order=in_order, **options)


def job(mixture: Mixture, world_size: int, num_workers: int, state: dict[str, Any] | None, steps: int | None,
        **options: Any) -> tuple[list[int], dict[str, Any]]:
    """Every rank loads `state` and takes `steps` batches (None: to the epoch's end); the
    items consumed, and the merged state of every rank (what load_checkpoint hands on)."""
    per_rank, merged = run_ranks(lambda rank: loader_of(mixture, rank, world_size, num_workers, **options),
                                 world_size, state, steps)
    return [item for items in per_rank for item in items], merged


@pytest.fixture(scope="module", params=[False, True], ids=["streams", "streams-and-map-style"])
def case(request, urls) -> tuple[Mixture, list[int], list[int]]:
    """A mixture and its first two uninterrupted in_order=False epochs at one rank without
    workers."""
    mixture = make_mixture(urls, request.param)
    loader = loader_of(mixture, 0, 1, 0)
    whole, following = ([item for batch in loader for item in batch.tolist()] for _ in range(2))
    return mixture, whole, following


def test_one_rank_without_workers_reads_the_positions_in_order_once_per_source_epoch(case):
    mixture, whole, following = case
    assert len(whole) == len(following) == LENGTH
    assert_once_per_source_epoch([whole, following])
    # "code" (62 items) is drawn past its first source-epoch: the check covered a wrap
    assert sum(100_000 <= item < MAP_BASE for item in whole) > 62


@pytest.mark.parametrize("chain", [[(2, 2, 3), (3, 1, None)], [(2, 2, 3), (2, 2, 2), (1, 0, None)],
                                   [(3, 2, 2), (2, 1, 3), (4, 2, None)]])
def test_resumes_at_any_layout_train_every_position_of_the_epoch_once(case, chain):
    mixture, whole, following = case
    consumed, state = [], None
    for world_size, num_workers, steps in chain:
        items, state = job(mixture, world_size, num_workers, state, steps)
        consumed += items
    assert Counter(consumed) == Counter(whole)
    second, _ = job(mixture, 2, 1, state, None)  # the next loader epoch: the mixture's next positions
    assert Counter(second) == Counter(following)


def test_an_unchanged_layout_without_workers_continues_exactly(case):
    mixture = case[0]
    whole = [batch.tolist() for batch in loader_of(mixture, 1, 2, 0)]
    loader = loader_of(mixture, 1, 2, 0)
    head = [batch.tolist() for batch in itertools.islice(loader, 4)]
    resumed = loader_of(mixture, 1, 2, 0)
    resumed.load_state_dict(loader.state_dict())
    assert head + [batch.tolist() for batch in resumed] == whole


def test_per_item_seeds_do_not_depend_on_the_rank_or_worker(urls):
    def noisy(file):
        for item in read_jsonl(file):
            yield item

    def mixture() -> Mixture:
        web = ShardedStream(urls["web"], noisy, window=8, seed=11, transform=lambda item: (item, random.random()))
        code = ShardedStream(urls["code"], noisy, window=4, seed=5, transform=lambda item: (item, random.random()))
        return Mixture({"web": web, "code": code}, {"web": 3, "code": 1}, 144)  # no source drawn twice

    def draws(world_size: int, num_workers: int) -> dict[int, float]:
        result = {}
        for rank in range(world_size):
            loader = ResumableDataLoader(mixture(), batch_size=GLOBAL_BATCH // world_size, rank=rank,
                                         world_size=world_size, num_workers=num_workers, in_order=False, seed=3,
                                         collate_fn=lambda items: items)
            result.update({item: value for batch in loader for item, value in batch})
        return result

    alone = draws(1, 0)
    assert draws(3, 2) == alone and len(set(alone.values())) == len(alone)


def test_the_state_stays_small(urls):
    loader = loader_of(make_mixture(urls, True), 0, 2, 4)
    list(itertools.islice(loader, 5))
    stream_state = loader.state_dict()["rank_0"]["stream"]
    assert sum(value.numel() * 8 for value in stream_state.values()) <= 4096


def test_progress_and_inspect_show_the_position_past_every_consumed_one(urls):
    mixture = make_mixture(urls)
    _, state = job(mixture, 2, 0, None, 7)  # no workers: each rank consumed its first 7 batches
    # rank 1's share starts at position 120: its 7 batches of 6 end at 162
    assert mixture.progress(state) == mixture.progress(162)
    assert describe(state, decode(state))[1] == ("  run position 162 (epoch 0, position 162): every consumed "
                                                 "position is below it")


def test_states_do_not_move_between_in_order_true_and_false(urls):
    mixture = make_mixture(urls)
    _, in_order = job(mixture, 2, 0, None, 3, in_order=True)
    with pytest.raises(ResumeStateError, match="^" + re.escape(
            "loader state was saved with in_order=True for a Mixture of streams, whose stream sources in_order=False "
            "reads in another sequence: resume it with in_order=True") + "$"):
        job(mixture, 2, 0, in_order, None)
    _, unordered = job(mixture, 2, 0, None, 3)
    with pytest.raises(ResumeStateError, match="^" + re.escape(
            "loader state was saved with in_order=False for a Mixture of streams, whose stream sources in_order=True "
            "reads in another sequence: resume it with in_order=False") + "$"):
        job(mixture, 2, 0, unordered, None, in_order=True)


def test_a_global_batch_holds_each_sources_share_of_its_positions(urls):
    """One rank, no workers: batch k is positions [k*b, (k+1)*b), so its sources are the
    schedule's at those positions."""
    mixture = make_mixture(urls, True)
    loader = loader_of(mixture, 0, 1, 0, batch_size=5)
    sources = [[source_of(item) for item in batch.tolist()] for batch in loader]
    keys = mixture.keys(range(LENGTH), seed=3, shuffle=True)
    assert sum(sources, []) == [mixture.names[source] for source, _ in keys]
    tables = [item - MAP_BASE for batch in loader_of(mixture, 0, 1, 0) for item in batch.tolist()
              if item >= MAP_BASE]
    assert tables == [index for source, index in keys if mixture.names[source] == "table"]
    assert torch.is_tensor(next(iter(loader)))


def test_reweighting_applies_from_the_position_past_every_consumed_one(urls):
    _, state = job(make_mixture(urls), 2, 2, None, 3)
    new = [(0, {"web": 1, "code": 1})]
    frontier = make_mixture(urls).progress(state)
    with pytest.raises(ResumeStateError, match=r"loader state was saved with Mixture weights .*pass reweight=True"):
        job(make_mixture(urls, stages=new), 3, 1, state, None)
    reweighted = make_mixture(urls, stages=new, reweight=True)
    after, _ = job(reweighted, 3, 1, state, None)
    position = sum(progress.draws for progress in frontier.values())
    assert reweighted.schedule.stages[-1].start == position and reweighted.schedule.stages[-1].quotas == (1, 1)
    assert len(after) == LENGTH - 3 * GLOBAL_BATCH
