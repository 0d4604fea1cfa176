"""Running a command that starts processes of its own (torchrun's ranks, loader workers)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any


def run_tree(command: Sequence[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess:
    """`subprocess.run(command, capture_output=True, text=True)`, except that a command still
    running after `timeout` seconds is killed with every process it started (its session),
    then fails the test with what it printed: no rank outlives the test that launched it."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise AssertionError(f"{' '.join(command)} did not end within {timeout} s\n"
                                 f"{stdout[-3000:]}\n{stderr[-5000:]}") from None
    return subprocess.CompletedProcess(list(command), process.returncode, stdout, stderr)
