"""A real gloo job over a ShardedStream saves a checkpoint mid-epoch at one world size and
num_workers; a job at another world size and num_workers loads it and finishes the epoch:
every item exactly once (G2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.checkpoint_worker import run
from tests.s3_server import free_port
from tests.stream_jobs import all_items, write_shards

WORKER = str(Path(__file__).with_name("stream_worker.py"))


@pytest.mark.slow
def test_gloo_job_resumes_a_sharded_stream_at_another_world_size(tmp_path: Path) -> None:
    args = {"urls": write_shards(str(tmp_path / "shards")), "ckpt": str(tmp_path / "ckpt"), "out": str(tmp_path / "out")}
    run("save", 2, dict(args, num_workers=2, steps=3), free_port(), script=WORKER)
    run("load", 3, dict(args, num_workers=1), free_port(), script=WORKER)
    out = Path(args["out"])
    saved = [json.loads(path.read_text()) for path in sorted(out.glob("consumed-save-*.json"))]
    loaded = [json.loads(path.read_text()) for path in sorted(out.glob("consumed-load-*.json"))]
    assert [len(items) for items in saved] == [12, 12]
    assert len(loaded) == 3
    assert sorted(item for items in saved + loaded for item in items) == all_items()
