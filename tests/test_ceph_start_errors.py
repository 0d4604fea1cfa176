"""storage/ceph_rgw.py names why a cluster did not start: a daemon that exited leads the
error, not the timeout or failure of the command that waited on it. Stand-in programs play
the daemons and tools (a Ceph command is run as `program -c ceph.conf ...`)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from storage.ceph_rgw import CephStartError, Cluster


def program(root: Path, name: str, body: str) -> str:
    """An executable that ignores its arguments and runs `body` (sh)."""
    path = root / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def cluster(tmp_path: Path):
    (tmp_path / "log").mkdir()
    started = Cluster(tmp_path, time.monotonic() + 60)
    yield started
    started.stop()


def test_a_command_that_fails_after_the_monitor_exited_names_the_exit_and_its_log(cluster, tmp_path):
    mon = program(tmp_path, "mon", "echo 'monitor data filesystem reached concerning levels' >&2; exit 28")
    cluster.start("mon.a", mon)
    cluster.daemons["mon.a"].wait(timeout=30)
    tool = program(tmp_path, "ceph", "echo 'timed out' >&2; exit 1")
    with pytest.raises(CephStartError) as raised:
        cluster.tool(tool, "--connect-timeout", "60", "osd", "new")
    message = str(raised.value)
    assert message.startswith(f"mon.a exited with 28, so: {tool} --connect-timeout 60 failed (1): timed out\n")
    assert re.search(r"--- mon\.a\.out \(last lines\)\nmonitor data filesystem reached concerning levels", message)


def test_a_command_that_fails_while_every_daemon_runs_says_only_that(cluster, tmp_path):
    cluster.start("mon.a", program(tmp_path, "mon", "exec sleep 60"))
    tool = program(tmp_path, "ceph", "echo 'bad argument' >&2; exit 22")
    with pytest.raises(CephStartError, match=re.escape(f"{tool} osd new failed (22): bad argument")) as raised:
        cluster.tool(tool, "osd", "new")
    assert "exited" not in str(raised.value)


def test_waiting_for_a_daemon_that_exited_names_it(cluster, tmp_path):
    cluster.start("osd.0", program(tmp_path, "osd", "exit 3"))
    with pytest.raises(CephStartError, match=r"^osd\.0 exited with 3, so: waiting for the OSD to be up\n"):
        cluster.wait_until(lambda: False, "the OSD to be up")
