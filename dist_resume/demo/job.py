"""Launching the demo training job with torchrun on this machine, and crashing it on purpose.

Only loopback addresses are used: the rendezvous listens on 127.0.0.1 and, on Linux, gloo
is pinned to the loopback interface unless ``GLOO_SOCKET_IFNAME`` is set.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import dist_resume
from dist_resume.demo.polling import poll_until

_POLL_SECONDS = 0.1
_PACKAGE_ROOT = str(Path(dist_resume.__file__).resolve().parents[1])


class JobError(RuntimeError):
    """The training job did not do what was expected of it; the message says what and where."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a local job: this dist_resume importable, loopback networking, and
    launch/*.sh running torchrun with this interpreter (``PYTHON``)."""
    env = dict(os.environ, **(extra or {}))
    env.setdefault("PYTHON", sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    if sys.platform.startswith("linux") and "GLOO_SOCKET_IFNAME" not in env:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # killed, but not yet reaped by its new parent
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def torchrun_command(nproc: int, train_args: Sequence[str]) -> list[str]:
    """``torchrun --nproc-per-node N -m dist_resume.demo.train ARGS`` on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--max-restarts=0",
            "--module", "dist_resume.demo.train", *train_args]


class TrainingJob:
    """A training job launched by ``command`` (torchrun or a launch script), output to ``log``."""

    def __init__(self, command: Sequence[str], log: str | os.PathLike, env: dict[str, str] | None = None) -> None:
        self.log = Path(log)
        with open(self.log, "w") as out:
            # A session of its own: killing the job never reaches the caller.
            self.process = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT,
                                            env=job_env(env), start_new_session=True)

    def __enter__(self) -> TrainingJob:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:  # interrupted: let torchrun stop its workers
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def _failure(self, what: str) -> JobError:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        errors = [line for line in lines if "Error" in line] or lines
        return JobError(f"{what}; last error: {errors[-1].strip() if errors else '(no output)'} (log: {self.log})")

    def wait_for_pause(self, pause_file: str | os.PathLike, timeout: float,
                       on_poll: Callable[[], None] = lambda: None) -> list[int]:
        """Wait until the job writes ``pause_file`` (see train.py's --pause-at-step); return
        the worker pids it lists."""
        def paused() -> bool:
            if os.path.exists(pause_file):
                return True
            if self.process.poll() is not None:
                raise self._failure(f"the job exited with code {self.process.returncode} before its pause")
            on_poll()
            return False

        poll_until(paused, timeout, lambda: self._failure(f"the job did not reach its pause within {timeout:.0f}s"),
                   _POLL_SECONDS)
        on_poll()
        return json.loads(Path(pause_file).read_text())["pids"]

    def wait(self, timeout: float, on_poll: Callable[[], None] = lambda: None) -> None:
        """Wait for the job to finish; raise unless it succeeded."""
        def finished() -> bool:
            if self.process.poll() is not None:
                return True
            on_poll()
            return False

        poll_until(finished, timeout, lambda: self._failure(f"the job did not finish within {timeout:.0f}s"),
                   _POLL_SECONDS)
        on_poll()
        if self.process.returncode:
            raise self._failure(f"the job exited with code {self.process.returncode}")

    def crash(self, worker_pids: Sequence[int], timeout: float = 60) -> None:
        """SIGKILL torchrun and every worker: a crash of the whole job, nothing cleans up."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        kill_workers(worker_pids, timeout)


def kill_workers(pids: Sequence[int], timeout: float = 60) -> None:
    """SIGKILL worker processes and wait until they are gone."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_until_gone(pids, timeout, "survived SIGKILL")


def wait_until_gone(pids: Sequence[int], timeout: float, what: str) -> None:
    """Return once every process of ``pids`` has exited; raise JobError ("... {what} for N s")
    if one still runs after ``timeout`` seconds."""
    poll_until(lambda: all(_gone(pid) for pid in pids), timeout,
               lambda: JobError(f"worker processes {list(pids)} {what} for {timeout:.0f}s"), _POLL_SECONDS)


def last_recorded_step(record_dir: str | os.PathLike) -> int:
    """The last step rank 0 of the newest run recorded (0 if none): progress for display."""
    runs = sorted(Path(record_dir).glob("run_*"))
    if not runs or not (runs[-1] / "rank0.jsonl").exists():
        return 0
    lines = (runs[-1] / "rank0.jsonl").read_bytes().splitlines()
    for line in reversed(lines):
        try:
            return json.loads(line)["step"]
        except ValueError:
            continue
    return 0
