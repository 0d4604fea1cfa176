"""The S3 server fixtures (tests/s3_server.py, tests/ceph_server.py) for every test module, the
rule that a skip is a failure where every case must run (tests/no_skips.py), and each test
ending as a job does: releasing the writer leases its saves took."""

from collections.abc import Iterator

import pytest

from dist_resume.checkpoint.lease import release_all

from tests.ceph_server import ceph_endpoint  # noqa: F401
from tests.no_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from tests.s3_server import s3_bucket, s3_endpoint, s3_store  # noqa: F401


@pytest.fixture(autouse=True)
def _release_writer_leases() -> Iterator[None]:
    """A test's saves take writer leases for this process, as a job's do; they are released
    when the test ends, as at a job's clean exit, while its folders and S3 servers still exist."""
    yield
    release_all()
