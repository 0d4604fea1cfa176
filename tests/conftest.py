"""The S3 server fixtures (tests/s3_server.py, tests/ceph_server.py) for every test module, and
the rule that a skip is a failure where every case must run (tests/no_skips.py)."""

from tests.ceph_server import ceph_endpoint  # noqa: F401
from tests.no_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from tests.s3_server import s3_bucket, s3_endpoint, s3_store  # noqa: F401
