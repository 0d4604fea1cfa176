"""``dist-resume demo --torchft``: replica groups die, come back, leave and join while the
job trains on (torchft: no restart, no checkpoint read); then their records are checked.

A lighthouse on 127.0.0.1 and 3 replica groups of one process each: g1 is SIGKILLed in the
middle of a step and restarted, g2 is SIGKILLed for good, and a new group g3 joins. Every
sample of every epoch must be in exactly one committed step, the committed steps must read
the epoch's order from its start, and every sample must carry the augmentation an
uninterrupted run gives it.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from dist_resume.demo.torchft_job import TorchftJob
from dist_resume.demo.torchft_verify import Tally, read_lines, tally

G1_KILLED, G1_BACK, G2_KILLED, G3_JOINS = 3, 5, 8, 11  # Manager steps


class TorchftDemoError(RuntimeError):
    """The torchft demo cannot run here (torchft missing, a used work directory)."""


@dataclass(frozen=True)
class TorchftDemoConfig:
    workdir: Path
    dataset_size: int = 100
    batch_size: int = 2
    epochs: int = 2
    seed: int = 0
    num_workers: int = 0
    timeout: float = 300.0  # for each wait on a group


def validate(config: TorchftDemoConfig) -> None:
    if importlib.util.find_spec("torchft") is None:
        raise TorchftDemoError("dist-resume demo --torchft needs torchft: pip install 'dist-resume[torchft]'")
    steps = config.dataset_size // (3 * config.batch_size)
    if steps <= G3_JOINS:
        raise TorchftDemoError(f"--dataset-size {config.dataset_size} gives {steps} steps of 3 groups per epoch; the "
                               f"demo's events need more than {G3_JOINS}: use at least "
                               f"{(G3_JOINS + 1) * 3 * config.batch_size}")
    if config.workdir.exists() and any(config.workdir.iterdir()):
        raise TorchftDemoError(f"work directory {config.workdir} is not empty")


def run_torchft_demo(config: TorchftDemoConfig, out: TextIO | None = None) -> Tally:
    """Run the scenario, check the records, print the report (to ``out``, default the current
    ``sys.stdout``); return the count."""
    out = out or sys.stdout
    validate(config)
    common = ["--dataset-size", str(config.dataset_size), "--batch-size", str(config.batch_size),
              "--epochs", str(config.epochs), "--seed", str(config.seed), "--num-workers", str(config.num_workers)]
    print(f"dist-resume demo --torchft: {config.epochs} epochs of {config.dataset_size} samples, batch "
          f"{config.batch_size} per group, torchft lighthouse on 127.0.0.1", file=out)
    started = time.perf_counter()
    with TorchftJob(config.workdir, common, config.timeout) as job:
        print(f"  lighthouse {job.url}; g0, g1, g2 start", file=out)
        g0 = job.start("g0", "--hold-at-step", str(G1_BACK), "--hold-at-step", str(G3_JOINS))
        g1 = job.start("g1", "--kill-at-step", str(G1_KILLED))
        g2 = job.start("g2", "--kill-at-step", str(G2_KILLED))
        job.go(g0, g1, g2)
        g1.exited()
        print(f"  step {G1_KILLED}: g1 SIGKILLed in the middle of the step", file=out)
        g1, = job.join_at(G1_BACK, [g0], "g1")
        print(f"  step {G1_BACK}: g1 restarted, it receives the position with the model", file=out)
        g2.exited()
        print(f"  step {G2_KILLED}: g2 SIGKILLed for good", file=out)
        g3, = job.join_at(G3_JOINS, [g0], "g3")
        print(f"  step {G3_JOINS}: g3 joins", file=out)
        for group in (g0, g1, g3):
            group.finished()
    lines = read_lines(job.records)
    counted = tally(lines, config.dataset_size, config.seed, config.epochs)
    print_lives(lines, out)
    print_report(counted, out)
    print(f"wall time {time.perf_counter() - started:.0f}s; logs and records in {config.workdir}", file=out)
    return counted


def print_lives(lines: list[dict], out: TextIO) -> None:
    """Each life of each group: the steps it ran, those it trained in, how it ended."""
    print("\ngroup  life  steps  trained in (committed, taking part)  ended", file=out)
    lives: dict[tuple[str, int], list[dict]] = {}
    for line in sorted(lines, key=lambda line: line["time"]):
        lives.setdefault((line["replica"], line["pid"]), []).append(line)
    numbers: dict[str, int] = {}
    for (replica, _), life in sorted(lives.items(), key=lambda item: (item[0][0], item[1][0]["time"])):
        numbers[replica] = numbers.get(replica, 0) + 1
        steps = [line["step"] for line in life if line["event"] == "step"]
        trained = sum(1 for line in life if line["event"] == "step" and line["committed"] and line["taking_part"])
        last = life[-1]
        ended = "finished" if last["event"] == "done" else f"killed in step {last['step'] + last.get('committed', 0)}"
        ran = f"{min(steps)}-{max(steps)}" if steps else "none"
        print(f"{replica:<5}  {numbers[replica]:<4}  {ran:<5}  {trained:<35}  {ended}", file=out)


def print_report(counted: Tally, out: TextIO) -> None:
    print(file=out)
    print("epoch  samples trained  lost  repeated  padding  committed steps in the epoch's order", file=out)
    for epoch in counted.epochs:
        order = "yes" if not epoch.out_of_order else f"no: {epoch.out_of_order}"
        print(f"{epoch.epoch:<5}  {epoch.trained:<15}  {len(epoch.lost):<4}  {epoch.repeated:<8}  "
              f"{epoch.padding:<7}  {order}", file=out)
    print(f"\ncommitted steps {counted.steps}; batches of steps not committed or not taken part in (not counted): "
          f"{counted.wasted}", file=out)
    checks = [("each sample exactly once per epoch over committed steps (G2)", counted.lost == 0 == counted.repeated),
              ("committed steps read each epoch's order from its start",
               not any(epoch.out_of_order for epoch in counted.epochs)),
              ("every serving of a sample has its uninterrupted augmentation (G4)",
               counted.augmentation_mismatches == 0)]
    for name, passed in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {name}", file=out)
    print(f"\nverdict: {'PASS' if counted.exact else 'FAIL'}", file=out)
