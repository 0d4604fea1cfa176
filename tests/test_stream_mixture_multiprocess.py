"""Real gloo jobs over a Mixture of two ShardedStreams whose weights change at position 60,
with real workers: 2 ranks x 2 workers stop and save after 3 global steps, 3 x 1 resume, cross
the stage change, stop and save, 1 x 2 finish the epoch, the global batch staying 12. The
global batches are the uninterrupted run's (G3), every source's items come exactly once per
source-epoch, and `dist-resume inspect` shows each source's progress at the last save."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dist_resume.cli import main
from tests.checkpoint_worker import run
from tests.s3_server import free_port
from tests.stream_mixture_jobs import assert_once_per_source_epoch, job, make_mixture, write_sources

WORKER = str(Path(__file__).with_name("stream_mixture_worker.py"))
# (scenario, ranks, workers, batches before the stop; None: to the end)
JOBS = [("first", 2, 2, 3), ("second", 3, 1, 4), ("third", 1, 2, None)]


def global_steps(out: Path, scenario: str, ranks: int) -> list[list[int]]:
    per_rank = [json.loads((out / f"batches-{scenario}-{rank}.json").read_text())["batches"] for rank in range(ranks)]
    assert len({len(batches) for batches in per_rank}) == 1, f"{scenario}: ranks got different numbers of batches"
    return [[item for batches in per_rank for item in batches[step]] for step in range(len(per_rank[0]))]


@pytest.mark.slow
def test_gloo_jobs_over_a_mixture_of_streams_resized_twice_give_the_uninterrupted_global_batches(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    urls = write_sources(str(tmp_path / "shards"))
    args = {"urls": urls, "ckpt": str(tmp_path / "ckpt"), "out": str(tmp_path / "out")}
    steps = []
    for save_step, (scenario, ranks, workers, stop) in enumerate(JOBS, start=1):
        job_args = dict(args, num_workers=workers)
        if stop is not None:
            job_args.update(steps=stop, save_step=save_step)
        run(scenario, ranks, job_args, free_port(), script=WORKER)
        steps += global_steps(Path(args["out"]), scenario, ranks)
    # canonical_streams=None: the first job's 4 slots, saved in its state and adopted since
    expected, _ = job(make_mixture(urls, canonical_streams=4), 1, 0, None, None)
    assert steps == expected
    assert_once_per_source_epoch(steps)
    assert main(["inspect", args["ckpt"], "--step", "2"]) == 0
    out = capsys.readouterr().out
    assert "  run position 84 (epoch 0, position 84): every consumed position is below it" in out
    assert "  source 'web': 53 draws, in source-epoch 0 with 53 of 178 samples read" in out
    assert "  source 'code': 31 draws, in source-epoch 0 with 31 of 62 samples read" in out
