"""A Mixture in real gloo jobs, checkpointed with save_checkpoint/load_checkpoint: 2 ranks
stop mid-stage, 3 ranks resume and stop again past the stage change, 1 rank resumes with
new weights (reweight=True) and runs to the end of the next epoch (G2, G3, G4, G6).

The reference is one uninterrupted process whose Mixture is given the schedule the
reweighting resume produces, as explicit stages."""

from __future__ import annotations

import itertools
import multiprocessing
import os
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist

from dist_resume import ResumableDataLoader, load_checkpoint, save_checkpoint, shut_down_distributed

from .mixture_datasets import LENGTHS, STAGES, mixture, samples
from .script_processes import spawn_ranks

SEED = 3
GLOBAL_BATCH = 6
EPOCHS = 2
NEW_WEIGHTS = {"web": 1, "code": 0, "books": 3}
RESUME_AT = 54  # where the 3-rank job stops: 4 + 5 global steps of 6


class Job(NamedTuple):
    world_size: int
    stop: int | None  # batches per rank before saving; None: to the end of epoch EPOCHS-1
    reweight: bool = False


JOBS = {"two": Job(2, 4), "three": Job(3, 5), "one": Job(1, None, reweight=True)}


def _run_job(step: int, name: str, job: Job, rank: int, out: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/store-{name}", rank=rank,
                            world_size=job.world_size, timeout=timedelta(seconds=60))
    mix = mixture(NEW_WEIGHTS, reweight=True) if job.reweight else mixture()
    loader = ResumableDataLoader(mix, batch_size=GLOBAL_BATCH // job.world_size, shuffle=True, seed=SEED,
                                 num_workers=2 if job.world_size == 3 else 0)
    load_checkpoint({"loader": loader}, str(out / "ckpt"))
    consumed = []

    def serve():
        for _ in range(loader.epoch, EPOCHS):
            for batch in loader:
                consumed.append(samples(batch))
                yield

    for _ in itertools.islice(serve(), job.stop):
        pass
    if job.stop is not None:
        save_checkpoint({"loader": loader}, str(out / "ckpt"), step)
    torch.save(consumed, out / f"{name}-{rank}.pt")
    shut_down_distributed()


def _rank_main(rank: int, out: Path) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    multiprocessing.set_start_method("fork", force=True)
    # A rank outside a job waits in the next job's init_process_group for that job's
    # ranks, which arrive after saving: the checkpoint is there before anyone loads it.
    for step, (name, job) in enumerate(JOBS.items()):
        if rank < job.world_size:
            _run_job(step, name, job, rank, out)


@pytest.fixture(scope="module")
def global_steps(tmp_path_factory: pytest.TempPathFactory) -> list[list[tuple]]:
    """The global steps the three jobs consumed, in order (ranks' batches concatenated)."""
    out = tmp_path_factory.mktemp("mixture_distributed")
    spawn_ranks(_rank_main, args=(out,), nprocs=max(job.world_size for job in JOBS.values()))
    steps: list[list[tuple]] = []
    for name, job in JOBS.items():
        ranks = [torch.load(out / f"{name}-{rank}.pt") for rank in range(job.world_size)]
        assert len({len(batches) for batches in ranks}) == 1
        steps += [[s for rank in ranks for s in rank[k]] for k in range(len(ranks[0]))]
    return steps


def _reference() -> list[list[tuple]]:
    stages = [*STAGES, (RESUME_AT, NEW_WEIGHTS)]
    loader = ResumableDataLoader(mixture(stages), batch_size=GLOBAL_BATCH, shuffle=True, seed=SEED)
    return [samples(batch) for _ in range(EPOCHS) for batch in loader]


@pytest.mark.slow
def test_G3_G4_same_global_steps_and_augmentations_as_one_uninterrupted_run(global_steps) -> None:
    assert global_steps == _reference()


@pytest.mark.slow
def test_G2_each_source_is_read_once_per_source_epoch(global_steps) -> None:
    keys = [s[:2] for step in global_steps for s in step]
    assert len(keys) == EPOCHS * 60
    for label, length in enumerate(LENGTHS.values()):
        read = [index for source, index in keys if source == label]
        for start in range(0, len(read), length):
            chunk = read[start : start + length]
            assert sorted(chunk) == list(range(length)) if len(chunk) == length else len(set(chunk)) == len(chunk)
    code = [source for source, _ in keys[RESUME_AT:]]
    assert 1 not in code  # the new weights hold from the resume position on
