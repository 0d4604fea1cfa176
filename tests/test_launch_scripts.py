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


SLEEPER = """
import os, sys, time
from pathlib import Path
assert sys.argv[1:] == ["--out", sys.argv[2]] and __name__ == "__main__"
Path(sys.argv[2], f"{os.getpid()}.pid").write_text("")
time.sleep(600)
"""


@pytest.mark.slow
def test_killing_the_launcher_ends_the_workers_of_any_script(tmp_path: Path) -> None:
    """A script that knows nothing of dist_resume: the launch scripts start it through
    `python -m dist_resume.launched`, which ties each worker to the launcher."""
    import subprocess
    import time

    from dist_resume.demo.job import wait_until_gone

    script, out = tmp_path / "sleeper.py", tmp_path / "pids"
    script.write_text(SLEEPER)
    out.mkdir()
    launcher = subprocess.Popen(["bash", str(ROOT / "launch" / "singlenode.sh"), "--nproc-per-node", "2", str(script),
                                 "--out", str(out)], env={**os.environ, "PYTHON": sys.executable},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(list(out.iterdir())) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        workers = [int(path.stem) for path in out.iterdir()]
        os.kill(launcher.pid, signal.SIGKILL)  # torchrun itself: the script exec'd it
        launcher.wait()
        wait_until_gone(workers, 60, "outlived their launcher")
    finally:
        for pid in [launcher.pid, *workers]:  # nothing outlives the test, whatever failed
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
