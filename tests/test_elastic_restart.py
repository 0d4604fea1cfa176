"""torchrun's elastic agent restarts a job whose worker was SIGKILLed (launch/elastic.sh,
--max-restarts 1); the restart resumes from the last committed checkpoint with no sample
lost or repeated (G2, G3, G4, G7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_resume.checkpoint.load import list_checkpoints
from dist_resume.demo.job import TrainingJob, free_port, kill_workers
from dist_resume.demo.records import read_runs
from dist_resume.demo.verify import verify

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["--epochs", "2", "--dataset-size", "40", "--global-batch", "8", "--save-every", "2", "--seed", "3"]


@pytest.mark.slow
def test_one_worker_killed_elastic_restart_resumes_exactly(tmp_path: Path) -> None:
    checkpoint, records, pause = tmp_path / "ckpt", tmp_path / "records", tmp_path / "pause.json"
    env = {"MIN_NODES": "1", "NPROC_PER_NODE": "2", "MAX_RESTARTS": "1",
           "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "RDZV_ID": "elastic-test"}
    command = ["bash", str(ROOT / "launch" / "elastic.sh"), str(ROOT / "launch" / "train.py"), *TRAIN,
               "--checkpoint", str(checkpoint), "--record", str(records),
               "--pause-at-step", "7", "--pause-file", str(pause)]
    with TrainingJob(command, tmp_path / "job.log", env) as job:
        pids = job.wait_for_pause(pause, timeout=150)
        kill_workers(pids[1:])  # one worker dies; torchrun must restart the job once
        job.wait(timeout=150)

    first, restart = read_runs(records)
    assert (first.restart, restart.restart) == (0, 1)
    assert max(r.step for r in first.steps) == 7  # step 7 was trained, never committed
    assert restart.resumed_from == 6
    verdict = verify(records, 40, 3, 8, 2)
    assert [(c.name, c.passed) for c in verdict.checks] == [
        ("steps: no step lost or repeated", True),
        ("G2 every sample exactly once per epoch", True),
        ("G3 global batches equal the reference", True),
        ("G4 augmentations equal the reference", True),
    ]
    assert [p.committed for p in verdict.phases] == [6, 10]
    assert [i.step for i in list_checkpoints(str(checkpoint))] == [2, 4, 6, 8, 10]

