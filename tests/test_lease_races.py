"""Exactly one writer wins any race for a run's writer lease (issue 33): jobs that start at the
same instant beside a stale lease, or beside none, on local disk and on S3. Real processes
racing, several rounds (tests/lease_race_job.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dist_resume import list_checkpoints
from dist_resume.storage import open_store, resolve
from tests import lease_race_job
from tests.lease_records import record, refused

JOBS = 8


def _race(base: str, tmp_path: Path, starts: list[str]) -> None:
    """``JOBS`` processes race to save into a new run per round; ``starts[i]``: what round i's
    run holds before ("stale": a stale lease, "none": nothing)."""
    rounds = []
    for number, start in enumerate(starts):
        url, folder = f"{base}/run{number}", tmp_path / f"round{number}"
        folder.mkdir()
        store = open_store(resolve(url))
        store.ensure_directory(store.loc.root)
        if start == "stale":
            # a job on another machine that stopped beating an hour ago (0.05 s period)
            store.overwrite(store.loc.join(".writer_lease_0"), record(time.time() - 3600))
        rounds.append({"url": url, "dir": str(folder)})
    env = {**os.environ, "DIST_RESUME_LEASE_REFRESH": "2", "OMP_NUM_THREADS": "1"}
    jobs = [subprocess.Popen([sys.executable, lease_race_job.__file__, json.dumps({"rounds": rounds, "index": i})],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(JOBS)]
    try:
        for race, start in zip(rounds, starts):
            folder = Path(race["dir"])
            (folder / "go").write_text("")
            outcomes = [_outcome(folder / f"outcome-{i}", jobs) for i in range(JOBS)]
            (folder / "done").write_text("")
            winners = [i for i, found in enumerate(outcomes) if found["outcome"] == "saved"]
            assert len(winners) == 1, (start, outcomes)
            generation = "1" if start == "stale" else "0"
            message = refused(race["url"], os.uname().nodename, outcomes[winners[0]]["pid"], generation,
                              stale_after="8")
            for found in outcomes:
                assert found["outcome"] == "saved" or re.fullmatch(message, found["outcome"]), found
            assert [info.step for info in list_checkpoints(race["url"])] == [winners[0] + 1]
        for job in jobs:
            assert job.wait(timeout=120) == 0, job.communicate()[0].decode()
    finally:
        for job in jobs:
            job.kill()


def _outcome(path: Path, jobs: list[subprocess.Popen]) -> dict:
    deadline = time.monotonic() + 300
    while not path.exists():
        failed = [job for job in jobs if job.poll() is not None]
        if failed or time.monotonic() > deadline:
            raise AssertionError(f"no {path.name}: {[job.communicate()[0].decode()[-2000:] for job in failed]}")
        time.sleep(0.01)
    return json.loads(path.read_text())


@pytest.mark.slow
def test_eight_jobs_racing_on_disk_give_one_writer_every_round(tmp_path: Path) -> None:
    _race(str(tmp_path / "runs"), tmp_path, ["stale", "none", "stale", "stale", "none", "stale"])


@pytest.mark.slow
def test_eight_jobs_racing_on_s3_give_one_writer_every_round(s3_bucket: str, tmp_path: Path) -> None:
    _race(s3_bucket, tmp_path, ["stale", "none", "stale"])
