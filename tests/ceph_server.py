"""A real S3 server for the suite: one Ceph cluster (mon, memstore OSD, radosgw) on
127.0.0.1 for the whole session, started on first use (storage/ceph_rgw.py does the work).

Without the Ceph programs the Ceph cases fail with how to install them; set
DIST_RESUME_SKIP_CEPH=1 to skip them instead (CI never does).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from storage.ceph_rgw import INSTALL_HINT, RGWEndpoint, ceph_rgw, missing_binaries

SKIP_VARIABLE = "DIST_RESUME_SKIP_CEPH"


@pytest.fixture(scope="session")
def ceph_endpoint() -> Iterator[RGWEndpoint]:
    """Ceph's RADOS Gateway on 127.0.0.1 with one S3 user, for the whole session."""
    missing = missing_binaries()
    if missing:
        message = (f"the Ceph S3 tests need {', '.join(missing)}; install them with "
                   f"`{INSTALL_HINT}` (as .ci/run does), or set {SKIP_VARIABLE}=1 to skip them")
        if os.environ.get(SKIP_VARIABLE) == "1":
            pytest.skip(message)
        pytest.fail(message, pytrace=False)
    with ceph_rgw() as endpoint:
        yield endpoint
