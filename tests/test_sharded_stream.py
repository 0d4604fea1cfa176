"""ShardedStream through ResumableDataLoader, on local files and on S3 (moto): jobs killed
mid-epoch and resumed at other world sizes and num_workers consume every item exactly once
per epoch (G2); an unchanged layout resumes exactly (G1); bad inputs are refused (G6)."""

from __future__ import annotations

import re

import pytest
from torch.utils.data import DataLoader

from dist_resume import ResumableDataLoader, ResumeStateError, plan_resume
from dist_resume.streams import ShardedStream

from .s3_server import s3_bucket, s3_endpoint  # noqa: F401
from .stream_jobs import (
    all_items,
    flat,
    make_loader,
    make_stream,
    read_jsonl,
    run_job,
    write_shards,
)


@pytest.fixture
def urls(tmp_path) -> list[str]:
    return write_shards(str(tmp_path))


# (world size, num_workers, batches per rank before the kill; None: to the epoch's end)
ELASTIC_JOBS = [
    [(2, 2, 3), (3, 0, 2), (1, 2, None)],
    [(1, 0, 5), (4, 2, 1), (2, 1, 2), (3, 2, None)],
    [(3, 1, 0), (2, 0, None)],  # killed before any batch
]


@pytest.mark.parametrize("jobs", ELASTIC_JOBS, ids=["2x2-3x0-1x2", "1x0-4x2-2x1-3x2", "3x1-2x0"])
def test_g2_every_item_once_per_epoch_across_elastic_resumes(urls, jobs):
    stream = make_stream(urls)
    state, consumed = None, []
    for world_size, num_workers, steps in jobs:
        per_rank, state = run_job(stream, world_size, num_workers, state, steps)
        consumed += per_rank
    assert flat(consumed) == all_items()
    # The next epoch, in a new job at yet another layout: every item once more, in another order.
    second, _ = run_job(stream, 2, 1, state, None)
    assert flat(second) == all_items()
    assert [item for items in second for item in items] != [item for items in consumed for item in items]


def test_epochs_follow_each_other_in_one_loader(urls):
    loader = make_loader(make_stream(urls), 0, 1, 2)
    epochs = [sorted(item for batch in loader for item in batch.tolist()) for _ in range(3)]
    assert epochs == [all_items()] * 3
    assert loader.epoch == 3


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stop", [0, 1, 4, 9])
def test_g1_same_layout_resumes_exactly(urls, num_workers, stop):
    stream = make_stream(urls)
    loaders = [make_loader(stream, rank, 2, num_workers) for rank in range(2)]
    expected, state = [], {}
    for loader in loaders:
        iterator = iter(loader)
        head = [next(iterator).tolist() for _ in range(stop)]
        state.update(loader.state_dict())
        expected.append([batch.tolist() for batch in iterator])
        assert len(head) == stop
    for rank in range(2):
        resumed = make_loader(stream, rank, 2, num_workers)
        resumed.load_state_dict(state)
        assert [batch.tolist() for batch in resumed] == expected[rank]


def test_an_elastic_resume_needs_every_rank(urls):
    stream = make_stream(urls)
    loader = make_loader(stream, 0, 2, 0)
    next(iter(loader))
    message = (
        "loader state holds ranks [0] of a world of 2, ranks [1] are missing: resuming at world size 3 with "
        "global batch 12 (saved: world size 2 with global batch 8) needs every rank's state "
        "(use dist_resume.load_checkpoint, or merge the state_dict() of every rank)"
    )
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        make_loader(stream, 0, 3, 0).load_state_dict(loader.state_dict())


def test_a_state_for_other_shards_is_refused(urls):
    loader = make_loader(make_stream(urls), 0, 1, 0)
    next(iter(loader))
    message = ("loader state entry 'rank_0' stream field 'meta' was saved for a ShardedStream with other shards, "
               "shuffle, window or seed")
    other = make_loader(make_stream(urls[:-1] + urls[:1]), 0, 1, 0)
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        other.load_state_dict(loader.state_dict())


def test_plain_dataloader_reads_every_item_in_shard_order_without_shuffle(urls):
    stream = ShardedStream(urls, read_jsonl, shuffle=False)
    items = [item for batch in DataLoader(stream, batch_size=5, num_workers=2) for item in batch.tolist()]
    assert sorted(items) == all_items()
    worker0 = [item for batch in DataLoader(stream, batch_size=5) for item in batch.tolist()]
    assert worker0 == all_items()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(shards="a.jsonl"), TypeError, "shards must be a sequence of path or URL strings"),
        (dict(reader=None), TypeError, "reader must be callable, got NoneType"),
        (dict(window=0), ValueError, "window must be an int >= 1, got 0"),
        (dict(window=True), TypeError, "window must be an int, got bool True"),
        (dict(seed=-1), ValueError, "seed must be in [0, 2**63), got -1"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, message):
    arguments = dict(shards=["a.jsonl"], reader=read_jsonl) | kwargs
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        ShardedStream(**arguments)


def test_shuffle_is_the_streams_setting():
    with pytest.raises(ValueError, match="IterableDataset"):
        ResumableDataLoader(ShardedStream(["a"], read_jsonl), shuffle=True)


def test_s3_shards_resume_elastically(s3_bucket):
    urls = write_shards(f"{s3_bucket}/shards")
    stream = make_stream(urls)
    consumed = []
    state = None
    for world_size, num_workers, steps in [(2, 2, 3), (3, 0, None)]:
        per_rank, state = run_job(stream, world_size, num_workers, state, steps)
        consumed += per_rank
    assert flat(consumed) == all_items()


def test_s3_storage_options_reach_the_reader(s3_bucket, s3_endpoint, monkeypatch):
    urls = write_shards(f"{s3_bucket}/shards")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    options = {"client_kwargs": {"endpoint_url": s3_endpoint}}
    per_rank, _ = run_job(make_stream(urls, options), 1, 0, None, None)
    assert flat(per_rank) == all_items()


def test_there_is_no_position_plan_for_a_stream(urls):
    loader = make_loader(make_stream(urls), 0, 1, 0)
    next(iter(loader))
    message = (
        "loader state belongs to an IterableDataset: it resumes per shard or per worker stream, "
        "there is no position plan to show"
    )
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        plan_resume(loader.state_dict(), 2)
