"""`loader.skip` in real gloo jobs: skips survive a save -> resume from 2 to 3 ranks (and 0 to
2 workers), skipped samples are never trained nor read by the resumed job (G2), and ranks that
skipped differently cannot save."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dist_resume.positions.epoch_order import EpochOrder
from tests import skip_worker
from tests.checkpoint_worker import run
from tests.s3_server import free_port
from tests.skip_worker import reads

LENGTH = 40


def _indices(positions) -> list[int]:
    return EpochOrder(LENGTH, 7, 0, True).indices(torch.tensor(list(positions)))


def _json(path: Path) -> list:
    return json.loads(path.read_text())


@pytest.mark.slow
def test_skips_survive_a_save_and_resume_from_2_to_3_ranks(tmp_path: Path) -> None:
    """2 ranks x 3 (no workers) train positions 0-11, skip 12-23, train 24-29 and save; 3 ranks
    x 3 with 2 workers each skip 30-38 and train 39. Every position is trained once or skipped,
    and the resumed job reads only what it trains."""
    args = {"out": str(tmp_path), "url": str(tmp_path / "ckpt"), "dataset_len": LENGTH, "batch_size": 3}
    run("skip_then_save", 2, {**args, "phase": "save", "num_workers": 0, "before": 2, "skips": [2, 2], "after": 1},
        free_port(), script=skip_worker.__file__)
    run("resume_to_the_end", 3, {**args, "phase": "load", "num_workers": 2, "skip_after_load": 1},
        free_port(), script=skip_worker.__file__)
    before = [_json(tmp_path / f"consumed-save-{rank}.json") for rank in range(2)]
    after = [_json(tmp_path / f"consumed-load-{rank}.json") for rank in range(3)]
    assert sorted(sum(before, [])) == sorted(_indices([*range(12), *range(24, 30)]))
    assert after == [_indices([39]), [], []]
    for rank in range(3):
        assert sorted(reads(tmp_path / f"reads-load-{rank}.log")) == sorted(after[rank])
    assert {json.dumps(_json(tmp_path / f"skipped-save-{rank}.json")) for rank in range(2)} == {json.dumps(
        ["epoch 0: global batches 2 to 3 (2), positions 12 to 23 (12)"])}
    # After the resume the global batch is 9: global batch 5 (the resumed job's first) holds 30-38.
    assert [_json(tmp_path / f"skipped-load-{rank}.json") for rank in range(3)] == [[
        "epoch 0: global batches 2 to 3 (2), positions 12 to 23 (12)",
        "epoch 0: global batches 5 to 5 (1), positions 30 to 38 (9)"]] * 3


@pytest.mark.slow
def test_ranks_that_skipped_differently_cannot_save(tmp_path: Path) -> None:
    args = {"out": str(tmp_path), "url": str(tmp_path / "ckpt"), "dataset_len": LENGTH, "batch_size": 3,
            "phase": "save", "num_workers": 0, "before": 1, "skips": [1, 2], "after": 0}
    run("skip_then_save", 2, args, free_port(), script=skip_worker.__file__)
    expected = ("cannot save step 1: the ranks have data loaders that skipped different batches: 'loader' (ranks [0]: "
                "epoch 0: global batches 1 to 1 (1), positions 6 to 11 (6); ranks [1]: epoch 0: global batches 1 to 2 "
                "(2), positions 6 to 17 (12)); every rank must call loader.skip() with the same number of batches")
    assert [(tmp_path / f"save-error-{rank}.txt").read_text() for rank in range(2)] == [expected] * 2
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())
