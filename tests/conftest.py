"""The S3 server fixtures (tests/s3_server.py, tests/ceph_server.py) for every test module, the
rule that a skip is a failure where every case must run (tests/no_skips.py), each test
ending as a job does (releasing the writer leases its saves took), and the Ceph cases kept
in one pytest-xdist worker."""

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from dist_resume.checkpoint.lease import release_all

from tests.ceph_server import ceph_endpoint  # noqa: F401
from tests.no_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from tests.s3_server import s3_bucket, s3_endpoint, s3_store  # noqa: F401


_COUNTS_CACHE = "DIST_RESUME_COUNTS_CACHE"
_created_cache = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """ShardedStreams keep the item counts they learn in a folder of this run's (inherited by
    the processes tests start, removed at the end), not in the user's cache."""
    if _COUNTS_CACHE not in os.environ:
        os.environ[_COUNTS_CACHE] = tempfile.mkdtemp(prefix="dist-resume-counts-")
        config.stash[_created_cache] = os.environ[_COUNTS_CACHE]


def pytest_unconfigure(config: pytest.Config) -> None:
    created = config.stash.get(_created_cache, None)
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)



def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """With pytest-xdist (the README's test command runs 2 workers, `--dist loadgroup` from
    pyproject), every case on Ceph RGW runs in one worker: the run starts one Ceph cluster and
    installs Ceph's packages at most once, never twice at the same time."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if "ceph_endpoint" in getattr(item, "fixturenames", ()) or any(value == "ceph" for value in params):
            item.add_marker(pytest.mark.xdist_group("ceph"))
    # The slow cases first, so that no worker starts a long one while the other runs out of work.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _release_writer_leases() -> Iterator[None]:
    """A test's saves take writer leases for this process, as a job's do; they are released
    when the test ends, as at a job's clean exit, while its folders and S3 servers still exist."""
    yield
    release_all()
