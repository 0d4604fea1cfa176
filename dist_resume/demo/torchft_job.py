"""A torchft job on this machine: a lighthouse on 127.0.0.1 and replica groups, each a
process of ``dist_resume.demo.torchft_group`` started, held, released and killed on cue.

The lighthouse is torchft's own server (the wheel's ``torchft_lighthouse``) on a free
loopback port. Every process runs in a session of its own and is ended by its pid when the
job ends. Waits are bounded by the job's timeout, never by a sleep that hopes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from dist_resume.demo.job import JobError, free_port, job_env, wait_until_gone
from dist_resume.demo.polling import poll_until

_POLL_SECONDS = 0.05
_STATUS_POLL_SECONDS = 0.005  # join_at's wait is within B11-first-data's timed restart
# The lighthouse's /status page counts the quorum requests waiting for its next quorum as
# "[<healthy>/<all> participants healthy]", healthy being those whose Managers still beat.
_WAITING = re.compile(r"\[(\d+)/\d+ participants healthy\]")


def _wait(done: Callable[[], bool], watched: Sequence[Group], what: str, timeout: float,
          timed_out: Callable[[], JobError], seconds: float = _POLL_SECONDS) -> None:
    """Wait for ``done()``, at most ``timeout`` seconds (then ``timed_out()`` is raised); a rank
    of ``watched`` that exits before it fails the wait, named as not having reached ``what``."""
    def reached() -> bool:
        # Exits are looked at before done(): a rank that ended right after reaching it is no failure.
        exits = [(group, group.exited_rank()) for group in watched]
        if done():
            return True
        for group, rank in exits:
            if rank is not None:
                raise group.exit_failure(rank, what)
        return False

    poll_until(reached, timeout, timed_out, seconds)


def lighthouse_command() -> str:
    """The ``torchft_lighthouse`` installed beside this interpreter (or on PATH)."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    found = str(beside) if beside.exists() else shutil.which("torchft_lighthouse")
    if found is None:
        raise JobError("torchft_lighthouse was not found: install torchft (pip install 'dist-resume[torchft]')")
    return found


class Group:
    """One life of a replica group: its processes (one per rank) and the files of their hooks."""

    def __init__(self, job: TorchftJob, replica_id: str, life: int, args: Sequence[str], module: str,
                 ranks: int) -> None:
        self.job, self.replica_id = job, replica_id
        name = f"{replica_id}-life{life}"
        names = [name] if ranks == 1 else [f"{name}-rank{rank}" for rank in range(ranks)]
        self.ready_files = [job.workdir / f"{each}.ready" for each in names]
        self.hold_prefixes = [job.workdir / f"{each}.hold" for each in names]
        self.logs = [job.workdir / f"{each}.log" for each in names]
        self.log = self.logs[0]
        self.processes: list[subprocess.Popen] = []
        for rank in range(ranks):
            command = [sys.executable, "-m", module, "--lighthouse", job.url, "--replica-id", replica_id,
                       "--records", str(job.records), "--ready-file", str(self.ready_files[rank]),
                       "--start-file", str(job.start_file), "--hold-prefix", str(self.hold_prefixes[rank]),
                       *job.common, *args]
            if ranks > 1:
                command += ["--group-rank", str(rank), "--group-size", str(ranks),
                            "--group-store", str(job.workdir / f"{name}.store")]
            # The ranks share one process group (rank 0's), so that a kill takes the whole group at
            # once, as a dead node would: a rank outliving rank 0 would fail in its Manager instead.
            group = 0 if rank == 0 else self.processes[0].pid
            with open(self.logs[rank], "w") as out:
                self.processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=job_env(),
                                                       process_group=group))

    def _until(self, done: Callable[[], bool], what: str, ending: bool = False) -> None:
        """Wait for ``done()``; a rank that exits first fails the wait, unless it waits for the end."""
        _wait(done, [] if ending else [self], what, self.job.timeout,
              lambda: self.failure(f"{self.replica_id} did not reach {what} within {self.job.timeout:.0f}s"))

    def exited_rank(self) -> int | None:
        """The first of its ranks that exited, None while all of them run."""
        return next((rank for rank, process in enumerate(self.processes) if process.poll() is not None), None)

    def exit_failure(self, rank: int, before: str) -> JobError:
        """The error of rank ``rank`` having exited before ``before``."""
        return self.failure(f"{self._name(rank)} exited with code {self.processes[rank].returncode} before {before}",
                            rank)

    def _name(self, rank: int) -> str:
        return self.replica_id if len(self.processes) == 1 else f"{self.replica_id} rank {rank}"

    def failure(self, what: str, rank: int = 0) -> JobError:
        log = self.logs[rank]
        lines = log.read_text(errors="replace").strip().splitlines()
        errors = [line for line in lines if "Error" in line] or lines
        return JobError(f"{what}; last error: {errors[-1].strip() if errors else '(no output)'} (log: {log})")

    def ready(self) -> Group:
        """Wait until the Managers of all its ranks run."""
        self._until(lambda: all(path.exists() for path in self.ready_files), "its Manager")
        return self

    def held(self, step: int) -> Group:
        """Wait until all its ranks hold at Manager step ``step`` (its --hold-at-step)."""
        self._until(lambda: all(Path(f"{prefix}-{step}.held").exists() for prefix in self.hold_prefixes),
                    f"its hold at step {step}")
        return self

    def release(self, step: int) -> None:
        for prefix in self.hold_prefixes:
            Path(f"{prefix}-{step}.release").write_text("")

    def exited(self) -> int:
        """Wait for the end of all its ranks; their exit code (a negative signal number if
        killed). Ranks that ended differently are an error that names each one's code."""
        self._until(lambda: all(process.poll() is not None for process in self.processes), "its end", ending=True)
        codes = [process.returncode for process in self.processes]
        if len(set(codes)) > 1:
            raise self.failure(f"the ranks of {self.replica_id} ended differently: exit codes {codes}",
                               max(range(len(codes)), key=lambda rank: codes[rank]))  # an error's log first
        return codes[0]

    def finished(self) -> None:
        """Wait for its end; raise unless all its ranks ran to their end."""
        code = self.exited()
        if code != 0:
            raise self.failure(f"{self.replica_id} exited with code {code}")

    def kill(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.wait()


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
        def listening() -> bool:
            if self.lighthouse.poll() is not None:
                raise JobError(f"the lighthouse exited with code {self.lighthouse.returncode} "
                               f"(log: {self.workdir / 'lighthouse.log'})")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        poll_until(listening, self.timeout,
                   lambda: JobError(f"the lighthouse did not listen on 127.0.0.1:{port} within {self.timeout:.0f}s"),
                   _POLL_SECONDS)

    def __enter__(self) -> TorchftJob:
        return self

    def __exit__(self, *exc: object) -> None:
        for group in self.groups:
            group.kill()
        pids = [process.pid for group in self.groups for process in group.processes]
        self.lighthouse.terminate()
        try:
            self.lighthouse.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.lighthouse.kill()
            self.lighthouse.wait()
        self._lighthouse_log.close()
        wait_until_gone(pids, 60, "outlived their job")

    def start(self, replica_id: str, *args: str, module: str = "dist_resume.demo.torchft_group",
              ranks: int = 1) -> Group:
        """A new life of group ``replica_id``: ``ranks`` processes of ``python -m module`` with the
        job's arguments (torchft_group's: lighthouse, replica id, records, hook files; with
        several ranks, each one's rank, the group size and its store's file) and ``args``."""
        life = sum(group.replica_id == replica_id for group in self.groups)
        group = Group(self, replica_id, life, args, module, ranks)
        self.groups.append(group)
        return group

    def join_at(self, step: int, holders: Sequence[Group], *replica_ids: str, ranks: int = 1) -> list[Group]:
        """Once every group of ``holders`` holds at Manager step ``step``, start new lives of
        ``replica_ids``; release the holders once the quorum requests of the new lives and of
        every other running group wait at the lighthouse: they all take part in that step."""
        for holder in holders:
            holder.held(step)
        joined = [self.start(replica_id, ranks=ranks).ready() for replica_id in replica_ids]
        # Released earlier, the holders (all of the last quorum's groups) would form the step's
        # quorum at once without a group whose request had not reached the lighthouse yet.
        requesting = [group for group in self.groups if group not in holders and group.exited_rank() is None]
        _wait(lambda: self.quorum_requests() == len(requesting), requesting,
              "its quorum request reached the lighthouse", self.timeout,
              lambda: JobError(f"the lighthouse did not hold {len(requesting)} quorum requests within "
                               f"{self.timeout:.0f}s (log: {self.workdir / 'lighthouse.log'})"),
              _STATUS_POLL_SECONDS)
        for holder in holders:
            holder.release(step)
        return joined

    def quorum_requests(self) -> int:
        """How many live groups' quorum requests wait at the lighthouse for its next quorum,
        as its ``/status`` page tells."""
        with urllib.request.urlopen(f"{self.url}/status", timeout=self.timeout) as response:
            page = response.read().decode(errors="replace")
        found = _WAITING.search(page)
        if found is None:
            raise JobError("the lighthouse's /status page does not tell its next quorum's participants "
                           f"('[N/M participants healthy]', as torchft 0.2's does): {page[:300]!r}")
        return int(found.group(1))

    def go(self, *groups: Group) -> None:
        """Once ``groups`` run their Managers, let every group take its first step: the first
        quorum then holds them all."""
        for group in groups:
            group.ready()
        self.start_file.write_text("")
