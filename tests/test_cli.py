"""`dist-resume ls / inspect / plan` on real checkpoints, and their one-line errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dist_resume.checkpoint.load import read_loader_states
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.cli import main
from dist_resume.demo.records import EpochPositions
from dist_resume.loader.resumable import ResumableDataLoader
from tests.merged_states import merged_from

ROOT = Path(__file__).resolve().parents[1]


def _loaders(world_size: int) -> list[ResumableDataLoader]:
    return [ResumableDataLoader(list(range(20)), batch_size=3, shuffle=True, seed=5, rank=rank,
                                world_size=world_size) for rank in range(world_size)]


class _Job:
    """Every rank's loader of a 2-rank job, saved from one process as one merged state."""

    def __init__(self) -> None:
        self.loaders = _loaders(2)
        self.iterators = [iter(loader) for loader in self.loaders]

    def step(self) -> None:
        for iterator in self.iterators:
            next(iterator)

    def state_dict(self) -> dict:
        return merged_from(self.loaders)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Steps 2 and 3 of a 2-rank job (20 samples, 3 per rank per step, seed 5)."""
    url = str(tmp_path_factory.mktemp("cli") / "ckpt")
    job = _Job()
    for step in (1, 2, 3):
        job.step()
        if step >= 2:
            save_checkpoint({"loader": job.state_dict(), "weights": {"w": [1.0] * 4}}, url, step)
    return url


def _run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ls_lists_committed_steps(checkpoints: str, capsys: pytest.CaptureFixture) -> None:
    (Path(checkpoints) / "step_00000009").mkdir()  # an uncommitted leftover is not listed
    code, out, err = _run(capsys, "ls", checkpoints)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0]) == ["step", "committed at", "world size", "size"]
    assert [re.split(r"\s{2,}", line)[0] for line in lines[1:]] == ["2", "3"]
    for line in lines[1:]:
        assert re.fullmatch(r"\d+\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+1\s+\d+\.\d KiB", line)


def test_inspect_describes_every_rank(checkpoints: str, capsys: pytest.CaptureFixture) -> None:
    code, out, err = _run(capsys, "inspect", checkpoints, "--step", "2")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "step 2: data loader state of 2 rank(s) under 'loader'",
        "  dataset 20 samples, seed 5, shuffle on, drop_last off, even_batches on",
        "  saved at world size 2, per-rank batch 3 (global batch 6)",
        "  rank 0: epoch 0 (in progress), 2 batches = 6 samples consumed this epoch",
        "  rank 1: epoch 0 (in progress), 2 batches = 6 samples consumed this epoch",
    ]
    code, out, _ = _run(capsys, "inspect", checkpoints)  # the latest step
    assert out.splitlines()[0] == "step 3: data loader state of 2 rank(s) under 'loader'"


def test_plan_matches_a_real_resume(checkpoints: str, capsys: pytest.CaptureFixture) -> None:
    """G2/G3: step 3 consumed 18 of 20 positions; at 3 ranks of 1 the last 2 are split and
    padded by one; what plan prints is what resumed loaders consume."""
    code, out, err = _run(capsys, "plan", checkpoints, "--world-size", "3", "--batch-size", "1")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "step 3: resuming at world size 3, per-rank batch 1 (global batch 3); saved at world size 2, per-rank batch 3",
        "  the global batch changes from 6 to 3",
        "  epoch 0: every rank continues it; then epoch 1 starts from its beginning",
        "  positions are places in epoch 0's sample order, 0 to 19 (as plan_resume and padding_positions report "
        "them); padding repeats the epoch's first positions",
        "  rank 0: 1 batches, 1 samples; positions 18",
        "  rank 1: 1 batches, 1 samples; positions 19",
        "  rank 2: 1 batches, 0 samples + 1 padding; positions none",
    ]
    _, state = read_loader_states(checkpoints)
    positions = EpochPositions(20, 5, True)
    consumed = []
    for rank in range(3):
        loader = ResumableDataLoader(list(range(20)), batch_size=1, shuffle=True, seed=5, rank=rank, world_size=3)
        loader.load_state_dict(state)
        consumed.append([positions(0, batch.tolist()) for batch in loader])
    assert consumed == [[[18]], [[19]], [[0]]]  # rank 2's one sample is padding: position 0 again


def test_plan_of_a_finished_epoch(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    loader = _loaders(1)[0]
    iterator = iter(loader)
    for _ in range(len(loader)):  # its last batch consumed, its iterator not yet ended
        next(iterator)
    save_checkpoint({"loader": loader}, str(tmp_path), 7)
    code, out, _ = _run(capsys, "plan", str(tmp_path), "--world-size", "4")
    assert code == 0
    assert out.splitlines() == [
        "step 7: resuming at world size 4, per-rank batch 3 (global batch 12); saved at world size 1, per-rank batch 3",
        "  the global batch changes from 3 to 12: the saved per-rank batch 3 is kept, as a resumed loader with the "
        "same batch_size does; no per-rank batch keeps it at 3 with 4 ranks",
        "  epoch 0 is finished: every rank starts epoch 1 from its beginning",
    ]


@pytest.mark.parametrize("argv,code,message", [
    (["ls"], 2, "the following arguments are required: url (see 'dist-resume ls --help')"),
    (["inspect"], 2, "the following arguments are required: url (see 'dist-resume inspect --help')"),
    (["plan", "URL"], 2, "the following arguments are required: --world-size (see 'dist-resume plan --help')"),
    (["plan", "URL", "--world-size", "0"], 2, "argument --world-size: must be >= 1, got 0 (see 'dist-resume plan --help')"),
    (["plan", "URL", "--world-size", "two"], 2,
     "argument --world-size: must be an integer, got 'two' (see 'dist-resume plan --help')"),
    (["ls", "  "], 2, "argument url: must name a checkpoint location, got '  ' (see 'dist-resume ls --help')"),
    (["plan", "/tmp/run ", "--world-size", "2"], 2,
     "argument url: must not start or end with whitespace, got '/tmp/run ' (see 'dist-resume plan --help')"),
    (["inspect", "URL", "--step", "-1"], 2, "argument --step: must be >= 0, got -1 (see 'dist-resume inspect --help')"),
    (["frobnicate"], 2, "argument COMMAND: invalid choice: 'frobnicate' (choose from 'demo', 'ls', 'inspect', 'plan') "
                        "(see 'dist-resume --help')"),
])
def test_usage_errors_are_one_line(argv: list[str], code: int, message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == code
    assert capsys.readouterr().err == f"dist-resume: error: {message}\n"


def test_checkpoint_errors_are_one_line(checkpoints: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    empty = str(tmp_path / "nothing")
    cases = [
        (["ls", empty], f"no committed checkpoint at {empty}"),
        (["inspect", empty], f"no committed checkpoint at {empty}"),
        (["plan", empty, "--world-size", "2"], f"no committed checkpoint at {empty}"),
        (["inspect", checkpoints, "--step", "7"], f"step 7 is not committed at {checkpoints} (committed steps: 2, 3)"),
        (["plan", checkpoints, "--step", "1", "--world-size", "2"],
         f"step 1 is not committed at {checkpoints} (committed steps: 2, 3)"),
        (["inspect", checkpoints, "--key", "weights"],
         f"step 3 at {checkpoints} holds no data loader state under 'weights'; it holds loader states under 'loader'"),
    ]
    for argv, message in cases:
        assert _run(capsys, *argv) == (1, "", f"dist-resume: error: {message}\n")


def test_python_dash_m_runs_the_command(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "dist_resume", "ls", str(tmp_path)], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"dist-resume: error: no committed checkpoint at {tmp_path}\n"


@pytest.mark.parametrize(("command", "shown"), [
    ("demo", ["--dataset-size N    samples in the synthetic dataset (default: 100)",
              "--save-every STEPS  global steps between checkpoints (default: 2)",
              "--seed SEED         the loader's seed (default: 0)",
              "--num-workers W     loader worker processes per rank (default: 0)",
              "--timeout SECONDS   limit for each launch of the job (default: 300)"]),
    ("plan", ["--world-size M", "number of ranks to resume at (required)", "(default: the latest)",
              "(default: loader)"]),
    ("inspect", ["(default: the latest)", "(default: loader)"]),
])
def test_help_shows_every_default(capsys: pytest.CaptureFixture, command: str, shown: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_code:
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert exit_code.value.code == 0
    for text in shown:
        assert " ".join(text.split()) in out
