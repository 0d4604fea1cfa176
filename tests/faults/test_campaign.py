"""The fault campaigns at CI size (issue 7): nothing lost, nothing repeated, no corrupted
checkpoint accepted (G2, G7), every fault of every kind injected."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import campaign, kill, local_disk, object_store
from tests.faults.proxy import KINDS
from tests.faults.summary import Summary
from tests.s3_server import s3_endpoint  # noqa: F401


def _assert_clean(summary: Summary) -> None:
    assert (summary.samples_lost, summary.samples_repeated, summary.corrupted_accepted) == (0, 0, 0), summary.format()


@pytest.mark.slow
def test_object_store_faults(s3_endpoint: str) -> None:
    summary = Summary()
    object_store.run(s3_endpoint, summary, rounds=campaign.CI.object_store_rounds)
    _assert_clean(summary)
    assert summary.checkpoints_verified == campaign.CI.object_store_rounds + 2
    assert summary.errors_as_expected == 3
    assert set(summary.faults) <= {f"s3.{kind}" for kind in KINDS} and sum(summary.faults.values()) > 0


def test_local_disk_faults(tmp_path: Path) -> None:
    summary = Summary()
    local_disk.run(tmp_path, summary, trials=campaign.CI.local_disk_trials)
    _assert_clean(summary)
    assert summary.faults == {f"disk.{kind}": 2 for kind in local_disk.KINDS}
    # verified: step 2 after each partial step directory and after each full disk's refused save;
    # refused: the 2 full-disk saves, then the loads of the 4 damaging kinds
    assert summary.checkpoints_verified == 4 and summary.errors_as_expected == 10


@pytest.mark.slow
def test_kill_campaign(tmp_path: Path) -> None:
    summary = Summary()
    kill.run(tmp_path, summary, trials=campaign.CI.kill_trials)
    _assert_clean(summary)
    assert summary.faults == {f"kill.{kind}": 1 for kind in kill.KINDS}
    assert summary.trials["kill"] == campaign.CI.kill_trials + 1
