"""Counting a ShardedStream's shard items in a real 2-rank gloo job: each rank counts only its
share of the shards and both get every shard's count; a second start counts none (their
counts kept); ranks that disagree on the shard list fail together with one clear error;
the shares cover every shard once (issue 21, issue 35)."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from hypothesis import given, strategies as st
import torch.multiprocessing

from dist_resume.streams import JsonlReader, ShardedStream
from dist_resume.streams.shard_counts import share

from .stream_jobs import SHARD_SIZES, write_shards


class RecordingReader(JsonlReader):
    """A JSONL reader whose `count` records which shards this process counted."""

    counted: list[str] = []

    def count(self, file) -> int:
        RecordingReader.counted.append(os.path.basename(file.path))
        return super().count(file)


def _rank(rank: int, root: str, urls: list[str]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        lengths = ShardedStream(urls, RecordingReader()).lengths()
        first = list(RecordingReader.counted)
        again = ShardedStream(urls, RecordingReader()).lengths()  # a second start: the counts kept
        # rank 1 leaves out a shard: both ranks must refuse, neither may hang
        shards = urls if rank == 0 else urls[:-1]
        try:
            ShardedStream(shards, RecordingReader()).lengths()
            refused = None
        except ValueError as exc:
            refused = str(exc)
        Path(root, f"rank{rank}.json").write_text(json.dumps(
            {"lengths": lengths, "again": again, "counted": first, "recounted": RecordingReader.counted[len(first):],
             "refused": refused}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_each_rank_counts_its_share_and_every_rank_gets_every_count(tmp_path, monkeypatch):
    monkeypatch.setenv("DIST_RESUME_COUNTS_CACHE", str(tmp_path / "counts"))
    urls = write_shards(str(tmp_path))
    torch.multiprocessing.start_processes(_rank, args=(str(tmp_path), urls), nprocs=2, start_method="fork")
    results = [json.loads(Path(tmp_path, f"rank{rank}.json").read_text()) for rank in range(2)]
    names = [os.path.basename(url) for url in urls]
    for rank, result in enumerate(results):
        assert result["lengths"] == result["again"] == list(SHARD_SIZES)
        # counted on threads, in any order; the second start and the refused list counted nothing
        assert sorted(result["counted"]) == [names[index] for index in share(len(urls), 2, rank)]
        assert result["recounted"] == []
        assert result["refused"] == (
            f"ShardedStream: ranks disagree on the shard list, its shuffling or the reader (rank {rank}: "
            f"{8 - rank} shards; rank {1 - rank}: {7 + rank} shards; or other shards of the same number, shuffle, "
            "window, seed or reader): every rank must build the stream from the same shard URLs, in the same "
            "order, with the same settings and reader")


@given(st.integers(0, 10_000), st.integers(1, 5_000))
def test_the_shares_cover_every_shard_once_in_runs_of_nearly_equal_length(shards, ranks):
    runs = [share(shards, ranks, rank) for rank in range(ranks)]
    assert [index for run in runs for index in run] == list(range(shards))
    assert max(map(len, runs)) - min(map(len, runs)) <= 1
