"""Ceph's daemons for the Ceph S3 cases, got by the test run itself (issue 23).

Where they are missing, a run as root with apt-get installs them (once, under a lock, so
parallel runs on one machine take turns); anywhere else the cases are skipped with the reason,
or fail with it when DIST_RESUME_NO_SKIPS=1 (CI sets it, so a skip never passes CI).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from storage.ceph_rgw import INSTALL_HINT, PACKAGES, missing_binaries
from tests.no_skips import NO_SKIPS, required

LOCK_FILE = Path(tempfile.gettempdir()) / "dist-resume-ceph-install.lock"
APT_LOCK_WAIT = 600  # seconds apt-get waits for another package manager to finish


@dataclass(frozen=True)
class Decision:
    """What to do about the Ceph cases: ``run``, ``install``, ``skip`` or ``fail``, and why."""

    action: Literal["run", "install", "skip", "fail"]
    message: str


def decide(missing: Sequence[str], is_root: bool, has_apt: bool, required: bool) -> Decision:
    """The one decision for the Ceph cases, given the missing programs, whether this process
    runs as root, whether apt-get is on PATH and whether every case must run."""
    if not missing:
        return Decision("run", "")
    if is_root and has_apt:
        return Decision("install", f"installing {' '.join(PACKAGES)} with apt-get for the Ceph S3 tests "
                                   f"(not found: {', '.join(missing)}); about 70 MB, a minute or two")
    reasons = [reason for reason, absent in (("not running as root", not is_root),
                                             ("apt-get not found", not has_apt)) if absent]
    message = (f"the Ceph S3 tests need {', '.join(missing)}, which the test run installs only as root "
               f"with apt-get ({' and '.join(reasons)}); install them with `{INSTALL_HINT}`")
    if required:
        return Decision("fail", f"{message} ({NO_SKIPS}=1 makes this a failure, not a skip)")
    return Decision("skip", message)


def _apt_get(*args: str, report: Callable[[str], None]) -> None:
    command = ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT}", *args]
    report(" ".join(command))
    result = subprocess.run(command, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-3000:]
        pytest.fail(f"installing Ceph for the Ceph S3 tests failed: `{' '.join(command)}` exited with "
                    f"{result.returncode}:\n{output}", pytrace=False)


def ensure_ceph(report: Callable[[str], None]) -> None:
    """Return once the Ceph programs are on PATH, installing them if this run can; otherwise
    skip the calling test, or fail it when DIST_RESUME_NO_SKIPS=1."""
    decision = decide(missing_binaries(), os.geteuid() == 0, shutil.which("apt-get") is not None,
                      required())
    if decision.action == "skip":
        pytest.skip(decision.message)
    if decision.action == "fail":
        pytest.fail(decision.message, pytrace=False)
    if decision.action == "run":
        return
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not missing_binaries():  # a parallel run installed them while this one waited
            return
        report(decision.message)
        start = time.monotonic()
        _apt_get("update", "-q", report=report)
        _apt_get("install", "-y", "-q", "--no-install-recommends", *PACKAGES, report=report)
    still = missing_binaries()
    if still:
        pytest.fail(f"installing {' '.join(PACKAGES)} left {', '.join(still)} missing from PATH", pytrace=False)
    report(f"Ceph installed in {time.monotonic() - start:.0f} s")
