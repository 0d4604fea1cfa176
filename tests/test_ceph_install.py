"""Who gets Ceph's daemons for the Ceph S3 cases (issue 23): a run as root with apt-get
installs them, any other run skips those cases with the reason, or fails with it under
DIST_RESUME_NO_SKIPS=1, as CI runs."""

from __future__ import annotations

import pytest

from tests.ceph_install import CEPH
from tests.debian_install import Decision, decide

MISSING = ["ceph-mon", "radosgw"]
HINT = "`apt-get update && apt-get install -y --no-install-recommends ceph-mon ceph-osd radosgw`"
INSTALLING = ("installing ceph-mon ceph-osd radosgw with apt-get for the Ceph S3 tests (not found: ceph-mon, "
              "radosgw); about 70 MB, a minute or two")
NEED = "the Ceph S3 tests need ceph-mon, radosgw, which the test run installs only as root with apt-get"
REQUIRED = " (DIST_RESUME_NO_SKIPS=1 makes this a failure, not a skip)"


@pytest.mark.parametrize("is_root", [True, False])
@pytest.mark.parametrize("has_apt", [True, False])
@pytest.mark.parametrize("required", [True, False])
def test_nothing_missing_runs(is_root: bool, has_apt: bool, required: bool) -> None:
    assert decide(CEPH, [], is_root, has_apt, required) == Decision("run", "")


@pytest.mark.parametrize("required", [True, False])
def test_root_with_apt_installs(required: bool) -> None:
    assert decide(CEPH, MISSING, True, True, required) == Decision("install", INSTALLING)


@pytest.mark.parametrize("is_root,has_apt,reason", [
    (False, True, "not running as root"),
    (True, False, "apt-get not found"),
    (False, False, "not running as root and apt-get not found"),
])
def test_without_root_or_apt_skips_or_fails_when_required(is_root: bool, has_apt: bool, reason: str) -> None:
    message = f"{NEED} ({reason}); install them with {HINT}"
    assert decide(CEPH, MISSING, is_root, has_apt, False) == Decision("skip", message)
    assert decide(CEPH, MISSING, is_root, has_apt, True) == Decision("fail", message + REQUIRED)
