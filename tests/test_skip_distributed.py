"""`loader.skip` in real gloo jobs: skips survive a save -> resume from 2 to 3 ranks (and 0 to
2 workers), skipped samples are never trained nor read by the resumed job (G2), and ranks that
skipped differently cannot save; also for a ShardedStream read with in_order=False."""

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


@pytest.mark.slow
def test_in_order_false_stream_skips_survive_saves_and_a_resume_from_2_to_3_ranks(tmp_path: Path) -> None:
    """A ShardedStream with in_order=False: 2 ranks x 2 workers train 2 batches and save;
    2 ranks x 2 workers load it, skip 3 global batches and save; 3 ranks x 1 worker load
    that, skip 1 more and finish. Every item is trained once or skipped, skipped items
    are never read after the skip, and every rank records the same skipped ranges."""
    from tests.stream_jobs import all_items, write_shards
    from tests.unordered_datasets import recorded

    base = {"out": str(tmp_path), "url": str(tmp_path / "ckpt"), "shards": write_shards(str(tmp_path))}
    phases = [("a", 2, {"num_workers": 2, "batch_size": 3, "take": 2, "save": 1}),
              ("b", 2, {"num_workers": 2, "batch_size": 3, "load": 1, "skip": 3, "take": 0, "save": 2}),
              ("c", 3, {"num_workers": 1, "batch_size": 2, "load": 2, "skip": 1, "take": None})]
    for phase, world_size, args in phases:
        run("stream_phase", world_size, {**base, **args, "phase": phase}, free_port(), script=skip_worker.__file__)
    trained = [i for phase, world_size, _ in phases for rank in range(world_size)
               for i in _json(tmp_path / f"consumed-{phase}-{rank}.json")]
    assert len(trained) == len(set(trained))
    skipped = set(all_items()) - set(trained)
    assert len(skipped) == 3 * 6 + 6
    assert recorded(tmp_path / "reads-b.log") == []  # phase b started no pass
    assert skipped.isdisjoint(recorded(tmp_path / "reads-c.log"))
    ranges = [_json(tmp_path / f"skipped-c-{rank}.json") for rank in range(3)]
    assert ranges[0] == ranges[1] == ranges[2] and len(ranges[0]) == 2
    assert ranges[0][0].startswith("epoch 0 global batch 2 to epoch 0 global batch 4: 3 of these global batches, "
                                   "and 18 positions between")
