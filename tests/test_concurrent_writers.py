"""Two jobs saving the same step into one URL (issue 11 point 1, G7): a committed step is
never overwritten or mixed, whatever the interleaving; the loser gets CheckpointExistsError
(saying that another job committed the step) and nothing it wrote is visible. Real processes; local disk and each S3 server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dist_resume import list_checkpoints, load_checkpoint, save_checkpoint
from tests import concurrent_writer
from tests.s3_server import fresh_store


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the paused writer did not reach its pause (exit code {proc.poll()})")
        time.sleep(0.01)


@pytest.fixture(params=["local", "moto", "ceph"])
def run_url(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        return str(tmp_path / "run")
    return f"{fresh_store(request, monkeypatch, request.param)}/run"


@pytest.mark.slow
@pytest.mark.parametrize("block_at", [".distcp", ".metadata"], ids=["before_shard", "before_metadata"])
def test_a_save_that_loses_the_race_commits_nothing(run_url: str, block_at: str, tmp_path: Path) -> None:
    """Job A passes its checks, then pauses; job B saves and commits the same step; A resumes.
    A writes without the writer lease (tests/concurrent_writer.py), as a job taken over does
    in the instant between its last lease check and its commit marker: two jobs write at once,
    and the commit still keeps the step whole."""
    save_checkpoint({"w": torch.full((4,), 1.0)}, run_url, 1)
    handshake = tmp_path / "handshake"
    handshake.mkdir()
    args = {"url": run_url, "step": 2, "value": 20.0, "block_at": block_at, "handshake": str(handshake)}
    job_a = subprocess.Popen([sys.executable, concurrent_writer.__file__, json.dumps(args)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for(handshake / "ready", job_a)
        save_checkpoint({"w": torch.full((4,), 2.0)}, run_url, 2)  # job B
        (handshake / "go").write_text("")
        output = job_a.communicate(timeout=120)[0].decode()
    finally:
        job_a.kill()
    assert job_a.returncode == 0, output
    message = (f"CheckpointExistsError: cannot save step 2 at {run_url}: another job committed it. Two jobs wrote "
               "this run: since this job's first save there, another job committed step 2. This save's files were "
               "removed, and the committed steps are unchanged. Stop the other job (a launcher killed with kill -9 "
               "leaves workers running that do not end with it: see docs/operations.md), then start this job "
               "again: it resumes from the newest committed step")
    assert (handshake / "outcome").read_text() == message
    assert [info.step for info in list_checkpoints(run_url)] == [1, 2]
    state = {"w": torch.zeros(4)}
    assert load_checkpoint(state, run_url) == 2 and torch.equal(state["w"], torch.full((4,), 2.0))
    assert load_checkpoint(state, run_url, 1) == 1 and torch.equal(state["w"], torch.full((4,), 1.0))
    if not run_url.startswith("s3://"):
        # A's own directory is gone; B's is the one its marker names
        attempts = sorted(p.name for p in (Path(run_url) / "step_00000002").iterdir())
        assert len(attempts) == 2 and attempts[0] == ".committed" and re.fullmatch(r"attempt_[0-9a-f]{32}", attempts[1])


@pytest.mark.slow
def test_a_save_that_starts_after_the_commit_is_refused_before_writing(run_url: str) -> None:
    save_checkpoint({"w": torch.full((4,), 2.0)}, run_url, 2)
    message = (f"step 2 is already committed at {run_url} by this job (an earlier save of step 2 committed it, even "
               "if that save raised); a committed checkpoint is never overwritten: give each save a new step")
    with pytest.raises(Exception, match=f"^{re.escape(message)}$"):
        save_checkpoint({"w": torch.full((4,), 3.0)}, run_url, 2)
    state = {"w": torch.zeros(4)}
    assert load_checkpoint(state, run_url) == 2 and torch.equal(state["w"], torch.full((4,), 2.0))
