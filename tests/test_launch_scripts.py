"""The launch scripts, run as the README shows them: the quick start's venv is the
interpreter they use, and a launcher killed with SIGKILL takes its workers with it (issue 23:
they ran on and kept committing, so a restart put two jobs on one checkpoint URL)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from dist_resume.demo.job import TrainingJob, wait_until_gone

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["--epochs", "2", "--dataset-size", "40", "--global-batch", "8", "--save-every", "2", "--seed", "3"]


@pytest.mark.slow
def test_killing_the_launcher_ends_its_workers(tmp_path: Path) -> None:
    pause = tmp_path / "pause.json"
    command = ["bash", str(ROOT / "launch" / "singlenode.sh"), "--nproc-per-node", "2", str(ROOT / "launch" / "train.py"),
               *TRAIN, "--checkpoint", str(tmp_path / "ckpt"), "--pause-at-step", "3", "--pause-file", str(pause)]
    with TrainingJob(command, tmp_path / "job.log", {"PYTHON": sys.executable}) as job:
        workers = job.wait_for_pause(pause, timeout=150)
        os.kill(job.process.pid, signal.SIGKILL)  # torchrun only, as `kill -9 <launcher>` does
        job.process.wait()
        wait_until_gone(workers, 60, "outlived their launcher")


def test_the_launch_scripts_take_the_quick_starts_venv(tmp_path: Path) -> None:
    """Without PYTHON, the scripts run torchrun with .venv/bin/python beside launch/ when it
    exists (the README's quick start makes it), else python3."""
    for script in ("singlenode.sh", "multinode.sh", "elastic.sh"):
        text = (ROOT / "launch" / script).read_text()
        assert 'source "$(dirname "$0")/python.sh"' in text and '"$PYTHON" -m torch.distributed.run' in text
    fake_root = tmp_path / "checkout"
    (fake_root / "launch").mkdir(parents=True)
    (fake_root / "launch" / "python.sh").write_text((ROOT / "launch" / "python.sh").read_text())
    probe = 'source "$(dirname "$0")/python.sh"; echo "$PYTHON"'
    (fake_root / "launch" / "probe.sh").write_text(probe)
    env = {key: value for key, value in os.environ.items() if key != "PYTHON"}
    assert _run(fake_root / "launch" / "probe.sh", env) == "python3"
    (fake_root / ".venv" / "bin").mkdir(parents=True)
    (fake_root / ".venv" / "bin" / "python").symlink_to(sys.executable)
    assert _run(fake_root / "launch" / "probe.sh", env) == f"{fake_root}/launch/../.venv/bin/python"
    assert _run(fake_root / "launch" / "probe.sh", {**env, "PYTHON": "/opt/py"}) == "/opt/py"


def _run(script: Path, env: dict[str, str]) -> str:
    import subprocess

    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True).stdout.strip()
