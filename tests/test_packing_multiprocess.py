"""Real gloo jobs over a packed stream with real workers (issue 34): a job of 2 ranks x 2
workers stops and saves, a job of 3 x 1 resumes, stops and saves, a job of 1 x 2 finishes
the epoch, the global batch staying 6. The global batches are the uninterrupted run's (G3),
each document's tokens are trained exactly once (G2; only the final step's padding repeats
whole sequences), and every sequence's position ids restart exactly where a document
piece starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.checkpoint_worker import run
from tests.packing_data import check_documents, packed_loader, packed_stream, write_documents
from tests.s3_server import free_port

WORKER = str(Path(__file__).with_name("packing_worker.py"))
# (scenario, ranks, workers, per-rank batch, batches before the stop; None: to the end)
JOBS = [("first", 2, 2, 3, 3), ("second", 3, 1, 2, 2), ("third", 1, 2, 6, None)]
GLOBAL_BATCH = 6


def global_steps(out: Path, scenario: str, ranks: int) -> list[list[dict]]:
    per_rank = [json.loads((out / f"batches-{scenario}-{rank}.json").read_text())["batches"] for rank in range(ranks)]
    assert len({len(batches) for batches in per_rank}) == 1, f"{scenario}: ranks got different numbers of batches"
    return [[row for batches in per_rank for row in batches[step]] for step in range(len(per_rank[0]))]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["concat", "fit"])
def test_gloo_jobs_resized_twice_train_every_document_once_in_the_uninterrupted_batches(tmp_path: Path, mode):
    urls = write_documents(str(tmp_path / "documents"))
    args = {"urls": urls, "mode": mode, "ckpt": str(tmp_path / "ckpt"), "out": str(tmp_path / "out")}
    steps = []
    for save_step, (scenario, ranks, workers, batch_size, stop) in enumerate(JOBS, start=1):
        job = dict(args, num_workers=workers, batch_size=batch_size)
        if stop is not None:
            job.update(steps=stop, save_step=save_step)
        run(scenario, ranks, job, free_port(), script=WORKER, timeout=300)
        steps += global_steps(Path(args["out"]), scenario, ranks)
    # canonical_streams=None: the first job's 4 slots, saved in its state and adopted since
    reference = packed_loader(packed_stream(urls, mode, canonical_streams=4), batch_size=GLOBAL_BATCH)
    assert steps == list(reference)
    sequences = [row for step in steps for row in step]
    distinct = {json.dumps(row): row for row in sequences}
    assert len(sequences) - len(distinct) == -sum(packed_stream(urls, mode).lengths()) % GLOBAL_BATCH
    check_documents(distinct.values())
