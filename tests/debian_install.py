"""Debian packages that some cases need (Ceph's daemons, etcd's server), got by the test run
itself (issue 23).

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
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from tests.no_skips import NO_SKIPS, required

LOCK_FILE = Path(tempfile.gettempdir()) / "dist-resume-apt-install.lock"
APT_LOCK_WAIT = 600  # seconds apt-get waits for another package manager to finish


@dataclass(frozen=True)
class Need:
    """Debian ``packages`` that hold the ``programs`` some cases (``cases``, "the Ceph S3
    tests") need; ``cost`` says what installing them takes."""

    cases: str
    packages: tuple[str, ...]
    programs: tuple[str, ...]
    cost: str

    @property
    def hint(self) -> str:
        return f"apt-get update && apt-get install -y --no-install-recommends {' '.join(self.packages)}"

    def missing(self) -> list[str]:
        """The programs not on PATH."""
        return [name for name in self.programs if shutil.which(name) is None]


@dataclass(frozen=True)
class Decision:
    """What to do about the cases: ``run``, ``install``, ``skip`` or ``fail``, and why."""

    action: Literal["run", "install", "skip", "fail"]
    message: str


def decide(need: Need, missing: Sequence[str], is_root: bool, has_apt: bool, required: bool) -> Decision:
    """The one decision for ``need``'s cases, given the missing programs, whether this process
    runs as root, whether apt-get is on PATH and whether every case must run."""
    if not missing:
        return Decision("run", "")
    if is_root and has_apt:
        return Decision("install", f"installing {' '.join(need.packages)} with apt-get for {need.cases} "
                                   f"(not found: {', '.join(missing)}); {need.cost}")
    reasons = [reason for reason, absent in (("not running as root", not is_root),
                                             ("apt-get not found", not has_apt)) if absent]
    message = (f"{need.cases} need {', '.join(missing)}, which the test run installs only as root "
               f"with apt-get ({' and '.join(reasons)}); install them with `{need.hint}`")
    if required:
        return Decision("fail", f"{message} ({NO_SKIPS}=1 makes this a failure, not a skip)")
    return Decision("skip", message)


def _apt_get(need: Need, *args: str, report: Callable[[str], None]) -> None:
    command = ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT}", *args]
    report(" ".join(command))
    result = subprocess.run(command, check=False, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-3000:]
        pytest.fail(f"installing {' '.join(need.packages)} for {need.cases} failed: `{' '.join(command)}` "
                    f"exited with {result.returncode}:\n{output}", pytrace=False)


def ensure(need: Need, report: Callable[[str], None]) -> None:
    """Return once ``need``'s programs are on PATH, installing them if this run can; otherwise
    skip the calling test, or fail it when DIST_RESUME_NO_SKIPS=1."""
    decision = decide(need, need.missing(), os.geteuid() == 0, shutil.which("apt-get") is not None, required())
    if decision.action == "skip":
        pytest.skip(decision.message)
    if decision.action == "fail":
        pytest.fail(decision.message, pytrace=False)
    if decision.action == "run":
        return
    with open(LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not need.missing():  # a parallel run installed them while this one waited
            return
        report(decision.message)
        start = time.monotonic()
        _apt_get(need, "update", "-q", report=report)
        _apt_get(need, "install", "-y", "-q", "--no-install-recommends", *need.packages, report=report)
    still = need.missing()
    if still:
        pytest.fail(f"installing {' '.join(need.packages)} left {', '.join(still)} missing from PATH", pytrace=False)
    report(f"{' '.join(need.packages)} installed in {time.monotonic() - start:.0f} s")


def reporter(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Prints a line while it happens (an install, a server starting), not only with a failure."""
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def report(line: str) -> None:
        with nullcontext() if capture is None else capture.global_and_fixture_disabled():
            print(f"\ndist-resume: {line}", flush=True)

    return report
