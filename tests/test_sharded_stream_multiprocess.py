"""Real gloo jobs over a ShardedStream with real workers: a job of 2 ranks x 2 workers stops
and saves, a job of 3 x 1 resumes, stops and saves, a job of 1 x 2 finishes the epoch, the
global batch staying 6. The global batches are those of an uninterrupted run (G3), every
item comes exactly once apart from the final step's padding (G2), and within each job every
rank gets the same number of batches (even ends)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_resume import ResumableDataLoader
from tests.checkpoint_worker import run
from tests.s3_server import free_port
from tests.stream_jobs import all_items, make_stream, write_shards

WORKER = str(Path(__file__).with_name("stream_worker.py"))
# (scenario, ranks, workers, per-rank batch, batches before the stop; None: to the end)
JOBS = [("first", 2, 2, 3, 3), ("second", 3, 1, 2, 2), ("third", 1, 2, 6, None)]
GLOBAL_BATCH = 6


def global_steps(out: Path, scenario: str, ranks: int) -> list[list[int]]:
    per_rank = [json.loads((out / f"batches-{scenario}-{rank}.json").read_text())["batches"] for rank in range(ranks)]
    assert len({len(batches) for batches in per_rank}) == 1, f"{scenario}: ranks got different numbers of batches"
    return [[item for batches in per_rank for item in batches[step]] for step in range(len(per_rank[0]))]


@pytest.mark.slow
def test_gloo_jobs_resized_twice_give_the_uninterrupted_global_batches(tmp_path: Path) -> None:
    urls = write_shards(str(tmp_path / "shards"))
    args = {"urls": urls, "ckpt": str(tmp_path / "ckpt"), "out": str(tmp_path / "out")}
    steps = []
    for save_step, (scenario, ranks, workers, batch_size, stop) in enumerate(JOBS, start=1):
        job = dict(args, num_workers=workers, batch_size=batch_size)
        if stop is not None:
            job.update(steps=stop, save_step=save_step)
        run(scenario, ranks, job, free_port(), script=WORKER)
        steps += global_steps(Path(args["out"]), scenario, ranks)
    # canonical_streams=None: the first job's 4 slots, saved in its state and adopted since
    reference = ResumableDataLoader(make_stream(urls, canonical_streams=4), batch_size=GLOBAL_BATCH)
    expected = [batch.tolist() for batch in reference]
    assert steps == expected
    total = len(all_items())
    assert len(expected) == -(-total // GLOBAL_BATCH)
    items = [item for step in steps for item in step]
    assert sorted(set(items)) == all_items()
    assert len(items) - len(set(items)) == -total % GLOBAL_BATCH  # the final step's padding
