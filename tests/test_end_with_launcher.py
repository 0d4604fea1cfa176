"""Issue 32 point 2: the workers that torchrun starts end with it by default, as soon as they
import dist_resume, even when torchrun is killed with SIGKILL (Linux: the parent-death signal
is SIGKILL); nothing else is tied to its parent: not a DataLoader worker, not a process a
worker starts, not a process outside torchrun. ``DIST_RESUME_END_WITH_LAUNCHER=0`` opts out;
torchrun's own restarts of its workers run as before.

The kill itself, with the README's script: tests/test_readme_kill.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dist_resume.demo.job import free_port, job_env

PROBE = str(Path(__file__).with_name("launcher_probe.py"))
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")

REPORT = ("import ctypes, dist_resume; found = ctypes.c_int(-1); "
          "ctypes.CDLL(None).prctl(2, ctypes.byref(found)); print(found.value)")  # PR_GET_PDEATHSIG


def _signal_after_import(env: dict[str, str], new_session: bool) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith("TORCHELASTIC_") and key != "DIST_RESUME_END_WITH_LAUNCHER"}
    return subprocess.run([sys.executable, "-c", REPORT], env={**environment, **env}, capture_output=True, text=True,
                          start_new_session=new_session, timeout=300)


@pytest.mark.parametrize(("env", "new_session", "tied"), [
    ({"TORCHELASTIC_RUN_ID": "job-1"}, True, True),  # as torchrun starts a worker
    ({"TORCHELASTIC_RUN_ID": "job-1", "DIST_RESUME_END_WITH_LAUNCHER": "1"}, True, True),
    ({"TORCHELASTIC_RUN_ID": "job-1", "DIST_RESUME_END_WITH_LAUNCHER": "0"}, True, False),  # the opt-out
    ({"TORCHELASTIC_RUN_ID": "job-1"}, False, False),  # a worker's child: its environment, not its session
    ({}, True, False),  # not under torchrun
], ids=["torchrun_worker", "explicit_default", "opt_out", "child_of_a_worker", "no_torchrun"])
def test_only_a_worker_that_torchrun_started_is_tied_to_its_launcher(env: dict[str, str], new_session: bool,
                                                                     tied: bool) -> None:
    done = _signal_after_import(env, new_session)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == (signal.SIGKILL if tied else 0)


def test_a_value_of_the_opt_out_other_than_0_or_1_is_refused_at_import() -> None:
    done = _signal_after_import({"TORCHELASTIC_RUN_ID": "job-1", "DIST_RESUME_END_WITH_LAUNCHER": "no"}, True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ValueError: DIST_RESUME_END_WITH_LAUNCHER='no' is neither 1 (the default: the workers that torchrun "
        "starts end with it) nor 0 (they outlive a launcher killed with kill -9)")


@pytest.mark.slow
def test_under_torchrun_restarts_the_workers_are_tied_and_their_loader_workers_are_not(tmp_path: Path) -> None:
    """Rank 1 fails in torchrun's first attempt; torchrun (their parent, alive) restarts both
    workers and the job succeeds. Every worker of both attempts is tied to torchrun; the
    DataLoader worker each starts (spawn, so it imports dist_resume afresh) is not."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), PROBE, str(tmp_path), "--fail-first"]
    done = subprocess.run(command, env=job_env(), capture_output=True, text=True, timeout=600, start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    reports = {path.stem: json.loads(path.read_text()) for path in tmp_path.glob("attempt*.json")}
    assert sorted(reports) == ["attempt0.rank0", "attempt0.rank1", "attempt1.rank0", "attempt1.rank1"]
    assert {report["signal"] for report in reports.values()} == {signal.SIGKILL}
    assert len({report["parent"] for report in reports.values()}) == 1  # one torchrun, alive through the restart
    assert len({report["pid"] for report in reports.values()}) == 4
    assert all(report["loader_worker_parent_is_me"] and report["loader_worker_signal"] == 0
               for report in reports.values())
