"""The two-node training job (launch/multinode.sh) exits 0 in time, run after run, on each S3
server (issue 11: it hung at exit in gloo's process-group destructor)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults import shutdown


@pytest.mark.slow
def test_multinode_job_exits_every_time(s3_store: str, tmp_path: Path) -> None:
    results = list(shutdown.run(f"{s3_store}/jobs", tmp_path, runs=shutdown.CI_RUNS))
    assert [(r.number, r.error) for r in results] == [(n, None) for n in range(shutdown.CI_RUNS)]
