"""A real S3 server for the suite: one Ceph cluster (mon, memstore OSD, radosgw) on
127.0.0.1 for the whole session, started on first use (storage/ceph_rgw.py does the work).

Missing Ceph programs are installed by the run where it can, else the Ceph cases are
skipped or failed with the reason (tests/ceph_install.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext

import pytest

from storage.ceph_rgw import RGWEndpoint, ceph_rgw
from tests.ceph_install import ensure_ceph


@pytest.fixture(scope="session")
def ceph_endpoint(request: pytest.FixtureRequest) -> Iterator[RGWEndpoint]:
    """Ceph's RADOS Gateway on 127.0.0.1 with one S3 user, for the whole session."""
    capture = request.config.pluginmanager.getplugin("capturemanager")

    def report(line: str) -> None:  # shown while it happens, not only with a failure
        with nullcontext() if capture is None else capture.global_and_fixture_disabled():
            print(f"\ndist-resume: {line}", flush=True)

    ensure_ceph(report)
    with ceph_rgw() as endpoint:
        yield endpoint
