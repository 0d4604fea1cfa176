"""The demo's verifier: passes a correct job's records, counts a crashed run only up to the
step the next run resumed from, and names each way a job can go wrong."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dist_resume.demo.data import SyntheticDataset
from dist_resume.demo.records import EpochPositions, Recorder, start_run
from dist_resume.demo.verify import verify
from dist_resume.loader.resumable import ResumableDataLoader

SIZE, SEED, GLOBAL_BATCH, EPOCHS, WORLD_SIZE = 26, 1, 6, 2, 3  # 5 steps per epoch, last one padded


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Records of an uninterrupted in-process job of 3 ranks, written as train.py writes them."""
    directory = tmp_path_factory.mktemp("records")
    run = start_run(directory, WORLD_SIZE, GLOBAL_BATCH // WORLD_SIZE, 0)
    for rank in range(WORLD_SIZE):
        loader = ResumableDataLoader(SyntheticDataset(SIZE), batch_size=GLOBAL_BATCH // WORLD_SIZE, shuffle=True,
                                     seed=SEED, rank=rank, world_size=WORLD_SIZE)
        recorder = Recorder(directory, run, rank, EpochPositions(SIZE, SEED, True))
        step = 0
        while loader.epoch < EPOCHS:
            epoch, padding = loader.epoch, len(loader.padding_positions())
            for features, _, indices in loader:
                step += 1
                recorder.write(step, epoch, indices.tolist(), features, padding if loader.epoch != epoch else 0, 0.0)
        recorder.close()
    return directory


def _copy(job: Path, tmp_path: Path) -> Path:
    shutil.copytree(job, tmp_path / "records")
    return tmp_path / "records"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _failed(records: Path) -> dict[str, str]:
    return {c.name: c.detail for c in verify(records, SIZE, SEED, GLOBAL_BATCH, EPOCHS).checks if not c.passed}


def test_a_correct_job_passes(job: Path) -> None:
    verdict = verify(job, SIZE, SEED, GLOBAL_BATCH, EPOCHS)
    assert verdict.passed
    assert [c.detail for c in verdict.checks] == [
        "steps 1-10 each trained once",
        "26 samples x 2 epochs (padding epoch 0: 1, epoch 1: 1)",
        "10 global steps equal to the uninterrupted run",
        "54 augmented samples equal the reference",
    ]


def test_steps_after_the_resumed_checkpoint_are_rolled_back(job: Path, tmp_path: Path) -> None:
    """A run crashed after step 4 with step 3 committed: its step 4 does not count, the
    next run's (which resumed from 3) does."""
    records = _copy(job, tmp_path)
    start_run(records, WORLD_SIZE, GLOBAL_BATCH // WORLD_SIZE, 3)
    for rank in range(WORLD_SIZE):
        lines = _lines(records / "run_000" / f"rank{rank}.jsonl")
        _write(records / "run_000" / f"rank{rank}.jsonl", [line for line in lines if line["step"] <= 4])
        _write(records / "run_001" / f"rank{rank}.jsonl", [line for line in lines if line["step"] >= 4])
    verdict = verify(records, SIZE, SEED, GLOBAL_BATCH, EPOCHS)
    assert verdict.passed
    assert [(p.committed, p.rolled_back, p.samples) for p in verdict.phases] == [(3, 1, 18), (10, 0, 34)]


def test_a_lost_step_is_named(job: Path, tmp_path: Path) -> None:
    records = _copy(job, tmp_path)
    rank1 = records / "run_000" / "rank1.jsonl"
    _write(rank1, [line for line in _lines(rank1) if line["step"] != 2])
    failed = _failed(records)
    assert failed["steps: no step lost or repeated"] == "phase 1: step 2 recorded by ranks [0, 2] of 3"
    assert failed["G2 every sample exactly once per epoch"].startswith("epoch 0: missing positions [8, 9]")


def test_a_repeated_sample_is_named(job: Path, tmp_path: Path) -> None:
    records = _copy(job, tmp_path)
    rank0 = records / "run_000" / "rank0.jsonl"
    lines = _lines(rank0)
    lines[1]["positions"][0] = lines[0]["positions"][0]
    _write(rank0, lines)
    failed = _failed(records)
    assert failed["G2 every sample exactly once per epoch"] == "epoch 0: missing positions [6], repeated [0], unexpected []"
    assert failed["G3 global batches equal the reference"] == "phase 1: global step 2 holds other samples than the reference"


def test_a_different_augmentation_is_named(job: Path, tmp_path: Path) -> None:
    records = _copy(job, tmp_path)
    rank2 = records / "run_000" / "rank2.jsonl"
    lines = _lines(rank2)
    lines[5]["fingerprints"][1] = "0" * 16
    _write(rank2, lines)
    assert _failed(records) == {
        "G4 augmentations equal the reference": "phase 1: epoch 1 position 5 (step 6) was augmented differently"}
