"""Ceph's daemons for the Ceph S3 cases, got by the test run itself (tests/debian_install.py)."""

from __future__ import annotations

from collections.abc import Callable

from storage.ceph_rgw import BINARIES, PACKAGES
from tests.debian_install import Need, ensure

CEPH = Need("the Ceph S3 tests", PACKAGES, BINARIES, "about 70 MB, a minute or two")


def ensure_ceph(report: Callable[[str], None]) -> None:
    """Return once Ceph's programs are on PATH (see ``tests.debian_install.ensure``)."""
    ensure(CEPH, report)
