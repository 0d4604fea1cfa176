"""Lightning's Trainer with strategy="ddp" (CPU, gloo, torchrun) and LightningLoader
(issue 10 point 5b). Lightning writes rank 0's checkpoint only; every rank must resume
exactly from it, at the same and at another world size (G1, G2, G3)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from tests.process_tree import run_tree  # noqa: E402
from tests.s3_server import free_port  # noqa: E402

_WORKER = Path(__file__).with_name("lightning_ddp_worker.py")
_REPO = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, name: str, processes: int, batch_size: int, max_steps: int, save: bool = False,
         resume: Path | None = None, *extra: str) -> subprocess.CompletedProcess:
    out = tmp_path / name
    out.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(processes),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(_WORKER), str(out),
               str(batch_size), str(max_steps), str(out / "end.ckpt") if save else "-", str(resume or "-"), *extra]
    python_path = os.pathsep.join(filter(None, [str(_REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": python_path, "OMP_NUM_THREADS": "1"}
    return run_tree(command, timeout=300, env=env)


def _steps(tmp_path: Path, name: str, processes: int, *args) -> list[list[int]]:
    """The sorted samples of each global step the job trained (ranks merged)."""
    result = _run(tmp_path, name, processes, *args)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / name / f"rank_{rank}.json").read_text()) for rank in range(processes)]
    assert len({len(batches) for batches in ranks}) == 1  # DDP ranks train in lockstep
    return [sorted(sample for batches in ranks for sample in batches[step]) for step in range(len(ranks[0]))]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """Global batch 12 on 64 samples: 6 steps per epoch, the last one partial. An
    uninterrupted 2-process run of 8 steps, and one stopped after 2 with its checkpoint."""
    tmp_path = tmp_path_factory.mktemp("lightning_ddp")
    uninterrupted = _steps(tmp_path, "uninterrupted", 2, 6, 8)
    head = _steps(tmp_path, "head", 2, 6, 2, True)
    return tmp_path, uninterrupted, head, tmp_path / "head" / "end.ckpt"


@pytest.mark.slow
@pytest.mark.parametrize("processes, batch_size", [(2, 6), (3, 4), (1, 12)], ids=["same", "2to3", "2to1"])
def test_lightning_ddp_resumes_exactly_at_any_world_size_g1_g2_g3(interrupted, processes, batch_size):
    tmp_path, uninterrupted, head, checkpoint = interrupted
    epoch = uninterrupted[:6]
    assert sorted(sample for step in epoch for sample in step) == list(range(64))
    tail = _steps(tmp_path, f"tail_{processes}", processes, batch_size, 8, False, checkpoint)
    resumed = head + tail
    # Same samples in every global step (G3), except that a world size that does not divide
    # the epoch's last step pads it with repeats of samples trained earlier in the epoch (G2).
    padded = 5
    assert [set(step) for step in resumed[:padded] + resumed[padded + 1 :]] == \
           [set(step) for step in uninterrupted[:padded] + uninterrupted[padded + 1 :]]
    assert set(resumed[padded]) >= set(uninterrupted[padded])
    counts = collections.Counter(sample for step in resumed[:6] for sample in step)
    assert set(counts) == set(range(64)) and sum(counts.values()) - 64 < processes
    assert all(counts[sample] == 2 for sample in set(resumed[padded]) - set(uninterrupted[padded]))


@pytest.mark.slow
def test_lightning_ddp_refuses_a_loader_whose_ranks_differ_beyond_position(tmp_path):
    result = _run(tmp_path, "sampler", 2, 4, 2, False, None, "sampler")
    assert result.returncode != 0
    assert "Lightning checkpoints the loader state of rank 0 only" in result.stderr


@pytest.mark.slow
def test_lightning_ddp_refuses_a_loader_built_before_the_processes_started(tmp_path):
    result = _run(tmp_path, "early", 2, 4, 2, False, None, "early")
    assert result.returncode != 0
    assert "this ResumableDataLoader serves rank 0 of 1, but torch.distributed runs 2 processes" in result.stderr


@pytest.mark.slow
def test_lightning_ddp_resumes_exactly_after_two_resumes_at_other_world_sizes_g2(interrupted):
    """2 processes -> 1 (stops again mid-epoch, inside the re-partitioned rest) -> 1: Lightning
    still counts the epoch's steps from its start."""
    tmp_path, uninterrupted, head, checkpoint = interrupted
    middle = _steps(tmp_path, "middle", 1, 12, 3, True, checkpoint)
    tail = _steps(tmp_path, "after_middle", 1, 12, 8, False, tmp_path / "middle" / "end.ckpt")
    assert [set(step) for step in head + middle + tail] == [set(step) for step in uninterrupted]
