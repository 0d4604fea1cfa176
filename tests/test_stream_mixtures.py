"""A Mixture with ShardedStream sources through ResumableDataLoader, in process: the same
global batches at every world size and num_workers and through resizes (G3), every source's
items exactly once per source-epoch, window bounds on each step's proportions, reweighting,
the progress a state shows, and one clear error for each unsupported combination."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset

from dist_resume import Mixture, ResumableDataLoader, ResumeStateError
from dist_resume.mixtures.inspection import describe
from dist_resume.state.saved import decode
from dist_resume.streams import ShardedStream

from .datasets import Indices
from .stream_jobs import read_jsonl
from .stream_mixture_jobs import (
    GLOBAL_BATCH, LENGTH, MIXED_STAGES, STAGES, Table, assert_once_per_source_epoch, assert_window_bounds, job,
    make_mixture, write_sources,
)


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> dict[str, list[str]]:
    return write_sources(str(tmp_path_factory.mktemp("stream_mixture")))


@pytest.fixture(scope="module")
def reference(urls) -> list[list[int]]:
    steps, _ = job(make_mixture(urls, canonical_streams=4), 1, 0, None, None)
    return steps


@pytest.mark.parametrize("world_size, num_workers", [(2, 0), (3, 2), (4, 1), (6, 0)])
def test_global_batches_are_the_same_at_every_world_size_and_num_workers(urls, reference, world_size, num_workers):
    steps, _ = job(make_mixture(urls, canonical_streams=4), world_size, num_workers, None, None)
    assert steps == reference


def test_the_uninterrupted_run_reads_each_source_once_per_source_epoch_within_window_bounds(urls, reference):
    mixture = make_mixture(urls, canonical_streams=4)
    assert len(reference) == LENGTH // GLOBAL_BATCH and all(len(step) == GLOBAL_BATCH for step in reference)
    assert_once_per_source_epoch(reference)
    assert_window_bounds(mixture, reference, STAGES)
    # "code" (62 items) is drawn past its first source-epoch: the check above covered a wrap
    assert sum(item >= 100_000 for step in reference for item in step) > 62


@pytest.mark.parametrize("mixed", [False, True], ids=["streams", "streams-and-map-style"])
def test_a_run_resized_twice_gives_the_uninterrupted_global_batches(urls, mixed):
    mixture = make_mixture(urls, mixed)  # canonical_streams: the first job's 4 slots, adopted after
    state, steps = None, []
    for world_size, num_workers, stop in [(2, 2, 3), (3, 1, 4), (1, 2, None)]:
        done, state = job(mixture, world_size, num_workers, state, stop)
        steps += done
    expected, _ = job(make_mixture(urls, mixed, canonical_streams=4), 1, 0, None, None)
    assert steps == expected
    assert_once_per_source_epoch(steps)
    assert_window_bounds(mixture, steps, MIXED_STAGES if mixed else STAGES)


def test_reweighting_applies_the_new_weights_from_the_resume_position(urls):
    _, state = job(make_mixture(urls, canonical_streams=4), 2, 0, None, 3)
    new = [(0, {"web": 1, "code": 1})]
    with pytest.raises(ResumeStateError, match=r"loader state was saved with Mixture weights .*pass reweight=True"):
        job(make_mixture(urls, stages=new, canonical_streams=4), 3, 0, state, None)
    steps, _ = job(make_mixture(urls, stages=new, canonical_streams=4, reweight=True), 3, 0, state, None)
    rebased = [STAGES[0], (3 * GLOBAL_BATCH, new[0][1])]
    expected, _ = job(make_mixture(urls, stages=rebased, canonical_streams=4), 1, 0, None, None)
    assert steps == expected[3:]


def test_a_state_shows_each_sources_progress(urls):
    mixture = make_mixture(urls, canonical_streams=4)
    _, state = job(mixture, 2, 0, None, 7)  # 84 positions: the stage change at 60 passed
    assert mixture.progress(state) == mixture.progress(84)
    assert {name: progress.draws for name, progress in mixture.progress(84).items()} == {"web": 53, "code": 31}
    lines = describe(state, decode(state))
    assert lines[1] == "  run position 84 (epoch 0, position 84): every consumed position is below it"
    assert lines[2:] == ["  source 'web': 53 draws, in source-epoch 0 with 53 of 178 samples read",
                         "  source 'code': 31 draws, in source-epoch 0 with 31 of 62 samples read"]


def test_a_state_of_other_canonical_streams_is_refused(urls):
    _, state = job(make_mixture(urls, canonical_streams=4), 2, 0, None, 2)
    with pytest.raises(ResumeStateError, match="was saved with canonical_streams=4; this Mixture has "
                                               "canonical_streams=3"):
        job(make_mixture(urls, canonical_streams=3), 2, 0, state, None)


def _streams(urls, web: int | None, code: int | None) -> dict[str, Any]:
    return {"web": ShardedStream(urls["web"], read_jsonl, canonical_streams=web),
            "code": ShardedStream(urls["code"], read_jsonl, canonical_streams=code)}


def test_sources_that_disagree_on_canonical_streams_are_refused(urls):
    weights = {"web": 1, "code": 1}
    with pytest.raises(ValueError, match=r"^Mixture stream sources disagree on canonical_streams \(source 'web' has "
                                         r"canonical_streams=4, source 'code' has canonical_streams=6\): one mixture "
                                         r"reads all of them by the same canonical streams; give them one value, or "
                                         r"pass canonical_streams= to Mixture to set it for all$"):
        Mixture(_streams(urls, 4, 6), weights)
    with pytest.raises(ValueError, match=r"^Mixture canonical_streams=8 for all its stream sources, but source 'code' "
                                         r"has canonical_streams=6: give those sources canonical_streams=8 or None$"):
        Mixture(_streams(urls, None, 6), weights, canonical_streams=8)
    assert Mixture(_streams(urls, None, 6), weights).canonical_streams == 6
    assert Mixture(_streams(urls, 6, None), weights, canonical_streams=6).canonical_streams == 6
    assert Mixture(_streams(urls, None, None), weights).canonical_streams is None
    with pytest.raises(ValueError, match="^Mixture canonical_streams applies to ShardedStream sources; this Mixture "
                                         "has none$"):
        Mixture({"table": Table()}, {"table": 1}, canonical_streams=4)


class Counting(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_other_iterable_sources_and_indexing_a_stream_source_are_refused(urls):
    with pytest.raises(TypeError, match=r"^Mixture sources are map-style datasets \(len and indexing\) or "
                                        r"ShardedStreams; got Counting, an IterableDataset of another kind, whose "
                                        r"order cannot be re-partitioned: wrap its shards in a ShardedStream$"):
        Mixture({"web": Counting()}, {"web": 1})
    with pytest.raises(TypeError, match=r"^Mixture sources are map-style datasets \(len and indexing\) or "
                                        r"ShardedStreams; got object, which has no len\(\)$"):
        Mixture({"web": object()}, {"web": 1})
    mixture = make_mixture(urls)
    with pytest.raises(TypeError, match="^Mixture source 'web' is a ShardedStream, which is read by canonical "
                                        "streams, not by index: read this Mixture through ResumableDataLoader$"):
        mixture[0]


def test_len_counts_the_epochs_global_steps_and_a_plain_mixture_stays_map_style(urls):
    loader = ResumableDataLoader(make_mixture(urls), batch_size=4, rank=1, world_size=3)
    assert len(loader) == LENGTH // GLOBAL_BATCH
    assert len(list(loader)) == LENGTH // GLOBAL_BATCH
    plain = ResumableDataLoader(Mixture({"table": Table()}, {"table": 1}), batch_size=5)
    assert [batch.tolist() for batch in plain][0] == torch.arange(500_000, 500_005).tolist()


def test_a_sampler_for_a_mixture_of_streams_is_refused(urls):
    message = ("^a Mixture with ShardedStream sources orders its own global batches: ResumableDataLoader takes no "
               "sampler or batch_sampler for it$")
    with pytest.raises(ValueError, match=message):
        ResumableDataLoader(make_mixture(urls), sampler=range(LENGTH))
    with pytest.raises(ValueError, match=message):
        ResumableDataLoader(make_mixture(urls), batch_sampler=[[0, 1]])


def test_sources_continue_across_loader_epochs(urls):
    """Two loader epochs of 20 steps, the second resumed at another world size: the run's
    positions continue, so every source stays once per source-epoch over both epochs."""
    mixture = make_mixture(urls, canonical_streams=4)
    loader = ResumableDataLoader(mixture, batch_size=GLOBAL_BATCH, shuffle=True, seed=3)
    uninterrupted = [batch.tolist() for _ in range(2) for batch in loader]
    assert len(uninterrupted) == 2 * LENGTH // GLOBAL_BATCH
    assert_once_per_source_epoch(uninterrupted)
    first, state = job(mixture, 2, 1, None, None)
    loaders = [ResumableDataLoader(mixture, batch_size=GLOBAL_BATCH // 3, rank=rank, world_size=3, shuffle=True,
                                   seed=3) for rank in range(3)]
    per_rank = []
    for loader in loaders:
        loader.load_state_dict(state)  # taken once the first epoch's iterator ended: the second epoch
        per_rank.append([batch.tolist() for batch in loader])
    second = [sum(batches, []) for batches in zip(*per_rank)]
    assert first + second == uninterrupted


class LiveReaders:
    """A JSONL reader that counts the shard readers alive at once (num_workers=0: in process)."""

    def __init__(self) -> None:
        self.alive = self.most = 0

    def __call__(self, file):
        self.alive += 1
        self.most = max(self.most, self.alive)
        try:
            yield from read_jsonl(file)
        finally:
            self.alive -= 1


def test_a_small_source_drawn_over_many_source_epochs_keeps_few_shards_open(urls):
    """"code" holds 62 items and is drawn 600 times: readers of its finished source-epochs
    are let go (and their shards closed), so at most one per canonical stream stays open."""
    reader = LiveReaders()
    code = ShardedStream(urls["code"], reader, window=4, seed=5, canonical_streams=2)
    mixture = Mixture({"code": code, "table": Table()}, {"code": 5, "table": 1}, 720)
    items = [item for batch in ResumableDataLoader(mixture, batch_size=GLOBAL_BATCH) for item in batch.tolist()]
    assert_once_per_source_epoch([items])
    assert sum(item < 500_000 for item in items) == 600
    assert reader.most <= 2 + 1  # one per canonical stream, and the next source-epoch's while it opens


def test_states_of_a_map_style_mixture_and_of_a_mixture_of_streams_do_not_mix(urls):
    """The same names, item counts and weights, read as streams or by index: neither state
    resumes the other, whose order it does not describe."""
    by_index = Mixture({"web": Indices(178), "code": Indices(62)}, STAGES, LENGTH)
    _, streamed = job(make_mixture(urls), 2, 0, None, 3)
    with pytest.raises(ResumeStateError, match="^loader state was saved with sampling by an IterableDataset's streams; "
                                               "this loader samples by the loader's own epoch order$"):
        job(by_index, 2, 0, streamed, None)
    _, indexed = job(by_index, 2, 0, None, 3)
    with pytest.raises(ResumeStateError, match="^loader state was saved with sampling by the loader's own epoch order; "
                                               "this loader samples by an IterableDataset's streams$"):
        job(make_mixture(urls), 2, 0, indexed, None)


def _state_bytes(shards: int) -> int:
    streams = {name: ShardedStream([f"{name}-{i}.jsonl" for i in range(shards)], read_jsonl, lengths=[100] * shards)
               for name in ("web", "code")}
    mixture = Mixture(streams, [(0, {"web": 3, "code": 1}), (1000, {"web": 1, "code": 1})])
    buffer = io.BytesIO()
    torch.save(ResumableDataLoader(mixture, batch_size=4, rank=1, world_size=8).state_dict(), buffer)
    return len(buffer.getvalue())


def test_a_ranks_state_is_a_few_integers_whatever_the_shard_count():
    assert _state_bytes(10_000) == _state_bytes(10) <= 4096
