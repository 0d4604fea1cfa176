"""`dist-resume demo` end to end: three torchrun launches (2, 3, 1 processes), two SIGKILLs
mid-epoch, verified exactly-once (G2), global steps (G3) and augmentations (G4); locally and
on a loopback S3 server (G9)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dist_resume.checkpoint.load import list_checkpoints
from dist_resume.cli import main
from tests.s3_server import s3_bucket, s3_endpoint  # noqa: F401

# 2 epochs of 60 samples, global batch 12: 5 steps per epoch; crashes after steps 3 and 9,
# checkpoints every 2 steps, so each crash rolls one step back.
SIZES = ["--dataset-size", "60", "--global-batch", "12", "--save-every", "2", "--timeout", "150"]
TABLE = [
    # phase, world size, batch/rank, resumed from, steps kept, rolled back, samples, checkpoint step, ended
    ["1", "2", "6", "start", "1-2", "1", "24", "2", "SIGKILL after step 3", "ok"],
    ["2", "3", "4", "step 2", "3-8", "1", "72", "8", "SIGKILL after step 9", "ok"],
    ["3", "1", "12", "step 8", "9-10", "0", "24", "10", "finished", "ok"],
]


def _run_demo(workdir: Path, capsys: pytest.CaptureFixture, *extra: str) -> str:
    code = main(["demo", "--workdir", str(workdir), *SIZES, *extra])
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def _table(out: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in out.splitlines() if re.match(r"^\d\s", line)]


@pytest.mark.slow
def test_demo_crashes_twice_and_verifies_local(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = _run_demo(tmp_path / "demo", capsys)
    assert _table(out) == TABLE
    for line in ("PASS  steps: no step lost or repeated: steps 1-10 each trained once",
                 "PASS  G2 every sample exactly once per epoch: 60 samples x 2 epochs (padding epoch 0: 0, epoch 1: 0)",
                 "PASS  G3 global batches equal the reference: 10 global steps equal to the uninterrupted run",
                 "PASS  G4 augmentations equal the reference: 120 augmented samples equal the reference",
                 "verdict: PASS"):
        assert line in out.splitlines()
    assert [i.step for i in list_checkpoints(str(tmp_path / "demo" / "checkpoints"))] == [2, 4, 6, 8, 10]


@pytest.mark.slow
def test_demo_against_s3(tmp_path: Path, capsys: pytest.CaptureFixture, s3_bucket: str) -> None:
    url = f"{s3_bucket}/demo"
    out = _run_demo(tmp_path / "demo", capsys, "--checkpoint", url)
    assert _table(out) == TABLE
    assert "verdict: PASS" in out.splitlines()
    assert [(i.step, i.world_size) for i in list_checkpoints(url)] == [(2, 2), (4, 3), (6, 3), (8, 3), (10, 1)]


def test_demo_refuses_bad_sizes_and_used_locations(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cases = [
        (["--global-batch", "8"], "dist-resume: error: --global-batch must be a multiple of 6 "
                                   "(it is split over 2, 3, 1 processes), got 8 (see 'dist-resume demo --help')"),
        (["--dataset-size", "24"], "dist-resume: error: 2 steps per epoch are too few to crash twice mid-epoch; "
                                   "use a larger --dataset-size or a smaller --global-batch "
                                   "(see 'dist-resume demo --help')"),
    ]
    for extra, message in cases:  # usage errors: exit 2, as argparse's own
        assert main(["demo", "--workdir", str(tmp_path / "w"), *extra]) == 2
        assert capsys.readouterr().err == message + "\n"
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    assert main(["demo", "--workdir", str(tmp_path / "used")]) == 1
    assert capsys.readouterr().err == f"dist-resume: error: work directory {tmp_path / 'used'} is not empty\n"
