"""A torchft job on this machine: a lighthouse on 127.0.0.1 and replica groups, each a
process of ``dist_resume.demo.torchft_group`` started, held, released and killed on cue.

The lighthouse is torchft's own server (the wheel's ``torchft_lighthouse``) on a free
loopback port. Every process runs in a session of its own and is ended by its pid when the
job ends. Waits are bounded by the job's timeout, never by a sleep that hopes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from dist_resume.demo.job import JobError, free_port, job_env, wait_until_gone

_POLL_SECONDS = 0.05


def lighthouse_command() -> str:
    """The ``torchft_lighthouse`` installed beside this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    found = str(beside) if beside.exists() else shutil.which("torchft_lighthouse")
    if found is None:
        raise JobError("torchft_lighthouse was not found: install torchft (pip install 'dist-resume[torchft]')")
    return found


class Group:
    """One life of a replica group: its process and the files of its hooks."""

    def __init__(self, job: TorchftJob, replica_id: str, life: int, args: Sequence[str], module: str) -> None:
        self.job, self.replica_id = job, replica_id
        name = f"{replica_id}-life{life}"
        self.ready_file = job.workdir / f"{name}.ready"
        self.hold_prefix = job.workdir / f"{name}.hold"
        self.log = job.workdir / f"{name}.log"
        command = [sys.executable, "-m", module, "--lighthouse", job.url,
                   "--replica-id", replica_id, "--records", str(job.records), "--ready-file", str(self.ready_file),
                   "--start-file", str(job.start_file), "--hold-prefix", str(self.hold_prefix),
                   *job.common, *args]
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=job_env(),
                                            start_new_session=True)

    def _until(self, done, what: str) -> None:
        deadline = time.monotonic() + self.job.timeout
        while not done():
            if self.process.poll() is not None and not done():
                raise self.failure(f"{self.replica_id} exited with code {self.process.returncode} before {what}")
            if time.monotonic() > deadline:
                raise self.failure(f"{self.replica_id} did not reach {what} within {self.job.timeout:.0f}s")
            time.sleep(_POLL_SECONDS)

    def failure(self, what: str) -> JobError:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        errors = [line for line in lines if "Error" in line] or lines
        return JobError(f"{what}; last error: {errors[-1].strip() if errors else '(no output)'} (log: {self.log})")

    def ready(self) -> Group:
        """Wait until its Manager runs."""
        self._until(self.ready_file.exists, "its Manager")
        return self

    def held(self, step: int) -> Group:
        """Wait until it holds at Manager step ``step`` (its --hold-at-step)."""
        self._until(Path(f"{self.hold_prefix}-{step}.held").exists, f"its hold at step {step}")
        return self

    def release(self, step: int) -> None:
        Path(f"{self.hold_prefix}-{step}.release").write_text("")

    def exited(self) -> int:
        """Wait for its end; its exit code (a negative signal number if killed)."""
        self._until(lambda: self.process.poll() is not None, "its end")
        return self.process.returncode

    def finished(self) -> None:
        """Wait for its end; raise unless it ran to its end."""
        if self.exited() != 0:
            raise self.failure(f"{self.replica_id} exited with code {self.process.returncode}")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()


class TorchftJob:
    """A lighthouse and the lives of the replica groups, under ``workdir``; a context manager
    that ends every process it started."""

    def __init__(self, workdir: Path, common: Sequence[str] = (), timeout: float = 300.0,
                 heartbeat_timeout_ms: int = 3000) -> None:
        self.workdir, self.common, self.timeout = workdir, list(common), timeout
        self.records = workdir / "records"
        self.start_file = workdir / "start"
        self.groups: list[Group] = []
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._lighthouse_log = open(workdir / "lighthouse.log", "w")
        # join_timeout: a quorum waits for every group whose Manager runs; heartbeat_timeout: how
        # soon a killed group is dropped (a live one beats every 100 ms).
        self.lighthouse = subprocess.Popen(
            [lighthouse_command(), "--min_replicas", "1", "--bind", f"127.0.0.1:{port}",
             "--join_timeout_ms", str(int(timeout * 1000)), "--heartbeat_timeout_ms", str(heartbeat_timeout_ms)],
            stdout=self._lighthouse_log, stderr=subprocess.STDOUT, start_new_session=True)
        self._until_listening(port)

    def _until_listening(self, port: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            if self.lighthouse.poll() is not None:
                raise JobError(f"the lighthouse exited with code {self.lighthouse.returncode} "
                               f"(log: {self.workdir / 'lighthouse.log'})")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise JobError(f"the lighthouse did not listen on 127.0.0.1:{port} within {self.timeout:.0f}s")
                time.sleep(_POLL_SECONDS)

    def __enter__(self) -> TorchftJob:
        return self

    def __exit__(self, *exc: object) -> None:
        for group in self.groups:
            group.kill()
        pids = [group.process.pid for group in self.groups]
        self.lighthouse.terminate()
        try:
            self.lighthouse.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.lighthouse.kill()
            self.lighthouse.wait()
        self._lighthouse_log.close()
        wait_until_gone(pids, 60, "outlived their job")

    def start(self, replica_id: str, *args: str, module: str = "dist_resume.demo.torchft_group") -> Group:
        """A new life of group ``replica_id``: ``python -m module`` with the job's arguments
        (torchft_group's: lighthouse, replica id, records, hook files) and ``args``."""
        life = sum(group.replica_id == replica_id for group in self.groups)
        group = Group(self, replica_id, life, args, module)
        self.groups.append(group)
        return group

    def join_at(self, step: int, holders: Sequence[Group], *replica_ids: str) -> list[Group]:
        """Once every group of ``holders`` holds at Manager step ``step``, start new lives of
        ``replica_ids``; release the holders once their Managers run: they join that step's
        quorum (or, if theirs comes late, the next one's)."""
        for holder in holders:
            holder.held(step)
        joined = [self.start(replica_id).ready() for replica_id in replica_ids]
        for holder in holders:
            holder.release(step)
        return joined

    def go(self, *groups: Group) -> None:
        """Once ``groups`` run their Managers, let every group take its first step: the first
        quorum then holds them all."""
        for group in groups:
            group.ready()
        self.start_file.write_text("")
