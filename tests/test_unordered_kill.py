"""A 2-rank gloo job with in_order=False and stragglers, SIGKILLed (or stopped) mid-epoch
after a checkpoint, resumes at 3 ranks x 1 worker: every sample of the epoch exactly once
(G1 for in_order=False, G2); for a Mixture of two ShardedStreams, every item of each
source once."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import fsspec
import pytest

from dist_resume.demo.job import free_port
from tests.checkpoint_worker import launch, run

WORKER = str(Path(__file__).with_name("unordered_worker.py"))


@pytest.mark.slow
def test_killed_out_of_order_job_resumes_at_three_ranks_exactly_once(tmp_path: Path) -> None:
    args = {"out": str(tmp_path), "url": str(tmp_path / "ckpt"), "dataset_len": 60, "save_step": 3, "after_save": 2}
    procs = launch("train_and_wait", 2, args, free_port(), script=WORKER)
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"paused-{rank}").exists() for rank in range(2)):
            assert all(proc.poll() is None for proc in procs), (tmp_path / "train_and_wait-rank0.log").read_text()
            assert time.monotonic() < deadline, "the job did not reach its pause"
            time.sleep(0.1)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    run("resume", 3, args, free_port(), script=WORKER)

    before = [json.loads((tmp_path / f"consumed-before-{rank}.json").read_text()) for rank in range(2)]
    # Rank r's batch 0 waited for its gate: batches 1, 3 and 4 overtook it.
    assert before == [[[8, 9, 10, 11], [24, 25, 26, 27], [32, 33, 34, 35]],
                      [[12, 13, 14, 15], [28, 29, 30, 31], [36, 37, 38, 39]]]
    after = [json.loads((tmp_path / f"consumed-after-{rank}.json").read_text()) for rank in range(3)]
    samples = [i for rank in before + after for batch in rank for i in batch]
    counts = Counter(samples)
    assert sorted(counts) == list(range(60)) and set(counts.values()) == {1}


@pytest.mark.slow
def test_stopped_out_of_order_stream_job_resumes_at_three_ranks_exactly_once(tmp_path: Path) -> None:
    # 4 shards of 12 items: rank r's share is shards 2r and 2r+1, worker role j's shard 2r+j.
    shards = []
    for shard in range(4):
        shards.append(str(tmp_path / f"shard-{shard}.jsonl"))
        with fsspec.open(shards[-1], "w") as file:
            file.writelines(json.dumps({"id": shard * 1000 + i}) + "\n" for i in range(12))
    args = {"out": str(tmp_path), "url": str(tmp_path / "ckpt"), "shards": shards, "shard_items": 12, "save_step": 3}
    run("stream_train_and_stop", 2, args, free_port(), script=WORKER)
    run("stream_resume", 3, args, free_port(), script=WORKER)

    before = [json.loads((tmp_path / f"consumed-before-{rank}.json").read_text()) for rank in range(2)]
    # Role 0 waited for its gate: role 1's batches were handed on first.
    assert before == [[[1000 + i, 1001 + i, 1002 + i] for i in (0, 3, 6)],
                      [[3000 + i, 3001 + i, 3002 + i] for i in (0, 3, 6)]]
    after = [json.loads((tmp_path / f"consumed-after-{rank}.json").read_text()) for rank in range(3)]
    counts = Counter(i for rank in before + after for batch in rank for i in batch)
    assert sorted(counts) == [shard * 1000 + i for shard in range(4) for i in range(12)]
    assert set(counts.values()) == {1}


def _shards(root: Path, base: int, count: int) -> list[str]:
    """`count` JSONL shards of 12 items, shard s holding items base + s*1000 + i."""
    shards = []
    for shard in range(count):
        shards.append(str(root / f"shard-{base}-{shard}.jsonl"))
        with fsspec.open(shards[-1], "w") as file:
            file.writelines(json.dumps({"id": base + shard * 1000 + i}) + "\n" for i in range(12))
    return shards


@pytest.mark.slow
def test_stopped_out_of_order_mixture_of_streams_resumes_at_three_ranks_exactly_once(tmp_path: Path) -> None:
    # 72 positions, weights 2:1: "web" is drawn 48 times (its 4 shards once), "code" 24 (its 2 shards
    # once). Rank 0's role 0 reads positions 0-17 and waits at web's first item.
    sources = {"web": _shards(tmp_path, 0, 4), "code": _shards(tmp_path, 100_000, 2)}
    args = {"out": str(tmp_path), "url": str(tmp_path / "ckpt"), "sources": sources, "shard_items": 12,
            "weights": {"web": 2, "code": 1}, "length": 72, "batch_size": 3, "save_step": 2, "straggler": 0}
    run("mixture_train_and_stop", 2, args, free_port(), script=WORKER)
    run("mixture_resume", 3, args, free_port(), script=WORKER)

    before = [json.loads((tmp_path / f"consumed-before-{rank}.json").read_text()) for rank in range(2)]
    assert all(len(batches) == 2 for batches in before)
    assert 0 not in sum(before[0], [])  # rank 0's role 1 was handed on first
    after = [json.loads((tmp_path / f"consumed-after-{rank}.json").read_text()) for rank in range(3)]
    counts = Counter(i for rank in before + after for batch in rank for i in batch)
    web = [shard * 1000 + i for shard in range(4) for i in range(12)]
    code = [100_000 + shard * 1000 + i for shard in range(2) for i in range(12)]
    assert sorted(counts) == web + code and set(counts.values()) == {1}
