"""``dist-resume demo``: train, crash, resume at another world size, twice; then verify.

The job trains 2 epochs with a constant global batch split over 2, then 3, then 1
processes (e.g. 12 = 2x6 = 3x4 = 1x12). The first two launches are SIGKILLed in the
middle of an epoch, after a step that no checkpoint holds; each relaunch resumes from the
latest committed checkpoint. The records must then show every sample trained exactly
once per epoch (G2), global steps equal to an uninterrupted run (G3) and augmentations
equal to it (G4).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from dist_resume.checkpoint.load import list_checkpoints
from dist_resume.demo.job import TrainingJob, last_recorded_step, torchrun_command
from dist_resume.demo.verify import Verdict, verify

WORLD_SIZES = (2, 3, 1)
EPOCHS = 2


class DemoError(RuntimeError):
    """The demo could not run (a used location, a job that failed): one line says why."""


class DemoUsageError(DemoError):
    """Options the demo cannot run with (sizes it cannot crash mid-epoch with)."""


@dataclass(frozen=True)
class DemoConfig:
    workdir: Path
    checkpoint: str
    dataset_size: int = 100
    global_batch: int = 12
    save_every: int = 2
    seed: int = 0
    num_workers: int = 0
    timeout: float = 300.0  # per launch

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.dataset_size / self.global_batch)

    def kill_steps(self) -> tuple[int, int]:
        """Mid-epoch 0 and mid-epoch 1, each on a step no checkpoint holds, if possible."""
        steps = self.steps_per_epoch
        kills = []
        for epoch in range(EPOCHS):
            step = epoch * steps + steps // 2 + 1
            if step % self.save_every == 0 and step + 1 < (epoch + 1) * steps:
                step += 1
            kills.append(step)
        if not all(e * steps < k < (e + 1) * steps for e, k in enumerate(kills)):
            raise DemoUsageError(f"{steps} steps per epoch are too few to crash twice mid-epoch; use a larger "
                            "--dataset-size or a smaller --global-batch")
        return kills[0], kills[1]


def validate(config: DemoConfig) -> None:
    """Refuse sizes the demo cannot crash mid-epoch with, and locations already in use."""
    splits = math.lcm(*WORLD_SIZES)
    if config.global_batch % splits:
        raise DemoUsageError(f"--global-batch must be a multiple of {splits} (it is split over "
                        f"{', '.join(map(str, WORLD_SIZES))} processes), got {config.global_batch}")
    config.kill_steps()
    if config.workdir.exists() and any(config.workdir.iterdir()):
        raise DemoError(f"work directory {config.workdir} is not empty")
    if list_checkpoints(config.checkpoint):
        raise DemoError(f"{config.checkpoint} already holds checkpoints; give an empty location")


def _train_args(config: DemoConfig) -> list[str]:
    return ["--checkpoint", config.checkpoint, "--epochs", str(EPOCHS),
            "--global-batch", str(config.global_batch), "--dataset-size", str(config.dataset_size),
            "--num-workers", str(config.num_workers), "--seed", str(config.seed),
            "--save-every", str(config.save_every), "--record", str(config.workdir / "records")]


def run_demo(config: DemoConfig, out: TextIO | None = None) -> Verdict:
    """Run the three launches, verify their records, print the report (to ``out``, default
    the current ``sys.stdout``); return the verdict."""
    out = out or sys.stdout
    validate(config)
    config.workdir.mkdir(parents=True, exist_ok=True)
    records = config.workdir / "records"
    kills = config.kill_steps()
    total = EPOCHS * config.steps_per_epoch
    print(f"dist-resume demo: {EPOCHS} epochs of {config.dataset_size} samples, global batch "
          f"{config.global_batch}, checkpoint every {config.save_every} steps to {config.checkpoint}", file=out)
    endings = []
    started = time.perf_counter()
    for number, world_size in enumerate(WORLD_SIZES, start=1):
        kill = kills[number - 1] if number <= len(kills) else None
        args = _train_args(config)
        pause_file = config.workdir / f"pause-{number}.json"
        if kill is not None:
            args += ["--pause-at-step", str(kill), "--pause-file", str(pause_file)]
        what = f"SIGKILL at step {kill}" if kill else "to the end"
        with tqdm(total=total, desc=f"phase {number}: {world_size} proc, {what}", unit="step",
                  file=sys.stderr, leave=False, disable=None) as bar, \
                TrainingJob(torchrun_command(world_size, args), config.workdir / f"phase{number}.log") as job:
            def show() -> None:
                bar.n = last_recorded_step(records)
                bar.refresh()

            if kill is None:
                job.wait(config.timeout, show)
                endings.append("finished")
            else:
                job.crash(job.wait_for_pause(pause_file, config.timeout, show))
                endings.append(f"SIGKILL after step {kill}")
    seconds = time.perf_counter() - started
    verdict = verify(records, config.dataset_size, config.seed, config.global_batch, EPOCHS)
    print_report(verdict, endings, out)
    print(f"wall time {seconds:.0f}s; logs and records in {config.workdir}", file=out)
    return verdict


def print_report(verdict: Verdict, endings: list[str], out: TextIO) -> None:
    header = ("phase", "world size", "batch/rank", "resumed from", "steps kept", "rolled back",
              "samples", "checkpoint step", "ended", "verdict")
    rows = [header]
    for phase, ending in zip(verdict.phases, [*endings, *[""] * len(verdict.phases)]):
        run = phase.run
        padding = f" +{phase.padding} pad" if phase.padding else ""
        steps = sorted({r.step for r in phase.kept})
        rows.append((str(run.number + 1), str(run.world_size), str(run.batch_size),
                     f"step {run.resumed_from}" if run.resumed_from else "start",
                     f"{steps[0]}-{steps[-1]}" if steps else "none", str(phase.rolled_back),
                     f"{phase.samples}{padding}", str(phase.committed), ending,
                     "FAIL" if phase.problems else "ok"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print(file=out)
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip(), file=out)
    print(file=out)
    for check in verdict.checks:
        print(f"{'PASS' if check.passed else 'FAIL'}  {check.name}: {check.detail}", file=out)
    print(f"\nverdict: {'PASS' if verdict.passed else 'FAIL'}", file=out)


def default_workdir() -> Path:
    return Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")


def default_checkpoint(workdir: Path) -> str:
    return os.fspath(workdir / "checkpoints")
