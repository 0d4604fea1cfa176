"""The S3 server fixtures (tests/s3_server.py, tests/ceph_server.py) for every test module."""

from tests.ceph_server import ceph_endpoint  # noqa: F401
from tests.s3_server import s3_bucket, s3_endpoint, s3_store  # noqa: F401
