"""A real S3 server for the suite: one Ceph cluster (mon, memstore OSD, radosgw) on
127.0.0.1 for the whole session, started on first use (storage/ceph_rgw.py does the work).

Missing Ceph programs are installed by the run where it can, else the Ceph cases are
skipped or failed with the reason (tests/debian_install.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage.ceph_rgw import RGWEndpoint, ceph_rgw
from tests.ceph_install import ensure_ceph
from tests.debian_install import reporter


@pytest.fixture(scope="session")
def ceph_endpoint(request: pytest.FixtureRequest) -> Iterator[RGWEndpoint]:
    """Ceph's RADOS Gateway on 127.0.0.1 with one S3 user, for the whole session."""
    ensure_ceph(reporter(request))
    with ceph_rgw() as endpoint:
        yield endpoint
