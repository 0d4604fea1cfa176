"""Issue 35 point 3: in torch's own DataLoader suite run with `ResumableDataLoader` at load
average 12-19, two persistent-workers cases once waited 300 s for a batch. This re-runs
their patterns (tests/persistent_stress.py: 12 rounds of 19 loader passes and 41 worker
starts; a worker with no items, passes abandoned, loaders dropped mid-life) in a new process while
busy loops hold every core, each pass checked item for item. A hang ends its round at the
deadline with every thread's stack printed (faulthandler), which this test shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .process_tree import run_tree

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 12
ROUND_DEADLINE = 150  # seconds; a round takes 2-9 s at load average 4-9 on 2 cores
BUSY_LOOPS_PER_CORE = 3


def test_persistent_workers_reiterated_under_contention_never_wait_for_a_batch():
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(BUSY_LOOPS_PER_CORE * (os.cpu_count() or 1))]
    try:
        run = run_tree([sys.executable, "-W", "ignore", "-m", "tests.persistent_stress", str(ROUNDS),
                        str(ROUND_DEADLINE)], timeout=ROUNDS * ROUND_DEADLINE + 60, cwd=ROOT)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{run.stderr[-8000:]}"
    assert run.stdout.split("\n")[:-1] == [f"round {number} passed" for number in range(ROUNDS)], run.stdout
