"""Real multi-process (gloo) jobs: elastic resume (G2, G3, G6, G7, G9) and a rank killed
in the middle of a save (G7)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch

from dist_resume.checkpoint.load import list_checkpoints, load_checkpoint
from dist_resume.checkpoint.step_dirs import step_dir_name
from dist_resume.state.fields import ELASTIC_GUARD_KEY
from tests.checkpoint_worker import launch, run
from tests.s3_server import free_port

DATASET_LEN = 50


@pytest.mark.slow
@pytest.mark.parametrize("before,after", [(2, 3), (3, 2), (4, 1), (1, 4)])
def test_save_at_n_load_at_m_local_and_s3(before: int, after: int, tmp_path: Path, s3_bucket: str) -> None:
    """G2/G3: model (DDP), optimizer and ResumableDataLoader restored at a new world size
    from local disk (saved synchronously) and from S3 (saved asynchronously while training
    went on); the epoch then finishes with every sample consumed exactly once across the
    two runs."""
    local = tmp_path / "local"
    args = {
        "out": str(tmp_path / "out"),
        "urls": [str(local), f"{s3_bucket}/run"],
        "dataset_len": DATASET_LEN,
        "train_steps": 2,
        "step": 2,
        "plain_dcp_dir": str(local),
    }
    run("elastic_save", before, args, free_port())
    run("elastic_load", after, args, free_port())

    out = Path(args["out"])
    consumed = [p for f in sorted(out.glob("consumed-*.json")) for p in json.loads(f.read_text())]
    assert len(list(out.glob("consumed-load-*.json"))) == after
    assert sorted(consumed) == list(range(DATASET_LEN))
    # G6: plain dcp.load at a changed world size fails, naming the elastic entry point.
    for rank in range(after):
        error = (out / f"plain-dcp-error-{rank}.txt").read_text()
        assert f"loader.{ELASTIC_GUARD_KEY}" in error and "load_checkpoint" in error


@pytest.mark.slow
@pytest.mark.parametrize("after", [3, 1])
def test_elastic_resume_on_s3(after: int, tmp_path: Path, s3_store: str) -> None:
    """G2/G7/G9 on each S3 server: 2 ranks save mid-epoch, ``after`` ranks load model,
    optimizer and loader and finish the epoch; every sample is consumed exactly once."""
    args = {"out": str(tmp_path / "out"), "urls": [f"{s3_store}/run"], "dataset_len": DATASET_LEN,
            "train_steps": 3, "step": 3}
    run("elastic_save", 2, args, free_port())
    run("elastic_load", after, args, free_port())

    out = Path(args["out"])
    saved = [p for f in sorted(out.glob("consumed-save-*.json")) for p in json.loads(f.read_text())]
    loaded = [p for f in sorted(out.glob("consumed-load-*.json")) for p in json.loads(f.read_text())]
    assert len(saved) == 2 * 3 * 3 and len(list(out.glob("consumed-load-*.json"))) == after
    assert sorted(saved + loaded) == list(range(DATASET_LEN))
    assert [info.step for info in list_checkpoints(f"{s3_store}/run")] == [3]


@pytest.mark.slow
def test_rank_killed_mid_save_leaves_previous_step(tmp_path: Path) -> None:
    """G7: SIGKILL a rank while it writes its shard of step 2: no commit marker, and
    load_checkpoint returns step 1 with its data intact."""
    directory, ready = tmp_path / "ckpt", tmp_path / "ready"
    args = {"out": str(tmp_path / "out"), "dir": str(directory), "ready": str(ready), "victim": 1}
    procs = launch("killed_mid_save", 2, args, free_port())
    deadline = time.monotonic() + 120
    while not ready.exists():  # the victim writes this file once it is blocked mid-shard
        assert all(p.poll() is None for p in procs), "a rank exited before the save blocked"
        assert time.monotonic() < deadline, "the save never reached the blocking write"
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGKILL)
    assert procs[1].wait(timeout=60) == -signal.SIGKILL
    assert procs[0].wait(timeout=120) != 0, "the surviving rank must fail, not commit"

    step2 = directory / step_dir_name(2)
    assert step2.is_dir() and not (step2 / ".committed").exists()
    torch.manual_seed(0)
    expected = torch.randn(1000)
    state = {"shared": torch.zeros(1000), "per_rank": {"rank0": torch.zeros(4), "rank1": torch.zeros(4)}}
    assert load_checkpoint(state, str(directory)) == 1
    assert torch.equal(state["shared"], expected)
    assert torch.equal(state["per_rank"]["rank1"], torch.full((4,), 1.0))
    assert [info.step for info in list_checkpoints(str(directory))] == [1]
