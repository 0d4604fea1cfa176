"""Kill campaign (G2, G7): a multi-process gloo job SIGKILLed at seeded moments and resumed
each time with a random world size (1..3), then run to the end.

After each kill, the next run must load the newest committed step (checked against
``list_checkpoints``). At the end, every epoch's samples, counted over the records each
run made up to the step its successor resumed from (later steps were never committed and
are trained again), must be every index exactly once, padding (G2) excluded.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dist_resume import list_checkpoints
from tests.faults.summary import Summary
from tests.s3_server import free_port

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("training", "sync_save", "async_save", "workers_busy", "after_commit")
DATASET_LEN = 36
BATCH = 2
SAVE_EVERY = 3
RUN_TIMEOUT = 120.0  # seconds a run may take to reach its kill point or finish


def _launch(world_size: int, args: dict[str, Any], log: Path) -> list[subprocess.Popen]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(world_size))
    with open(log, "w") as out:
        return [subprocess.Popen([sys.executable, "-m", "tests.faults.kill_worker", json.dumps(args)],
                                 env=dict(env, RANK=str(rank)), cwd=ROOT, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
                for rank in range(world_size)]


def _kill(procs: list[subprocess.Popen]) -> None:
    """SIGKILL every rank with its DataLoader workers (each rank leads a session)."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for proc in procs:
        proc.wait(timeout=RUN_TIMEOUT)


def _run(world_size: int, args: dict[str, Any], log: Path) -> bool:
    """Run the job; True if it was killed at its kill point, False if it finished."""
    procs = _launch(world_size, args, log)
    ready = Path(args["ready"])
    deadline = time.monotonic() + RUN_TIMEOUT
    try:
        while not ready.exists():
            codes = [proc.poll() for proc in procs]
            if all(code is not None for code in codes):
                if any(codes):
                    raise AssertionError(f"run failed with exit codes {codes}:\n{log.read_text()}")
                return False
            if time.monotonic() > deadline:
                raise AssertionError(f"run neither reached its kill point nor finished:\n{log.read_text()}")
            time.sleep(0.05)
        return True
    finally:
        _kill(procs)


def _account(record: Path, runs: int, epochs: int, summary: Summary) -> None:
    """Count lost and repeated samples of every epoch over the records that count."""
    seen: dict[int, Counter[int]] = {}
    for run in range(runs):
        until = int((record / f"run{run + 1}-start.txt").read_text()) if run + 1 < runs else None
        for path in record.glob(f"run{run}-rank*.txt"):
            for line in path.read_text().splitlines():
                step, epoch, padding, indices = line.split(" ")
                if until is not None and int(step) > until:
                    continue
                batch = [int(i) for i in indices.split(",")]
                seen.setdefault(int(epoch), Counter()).update(batch[: len(batch) - int(padding)])
    assert set(seen) <= set(range(epochs)), f"epochs {sorted(seen)} trained, {epochs} asked"
    for counts in (seen.get(epoch, Counter()) for epoch in range(epochs)):
        summary.samples_lost += sum(1 for index in range(DATASET_LEN) if counts[index] == 0)
        summary.samples_repeated += sum(count - 1 for count in counts.values() if count > 1)


def run(root: Path, summary: Summary, *, trials: int, seed: int = 0) -> None:
    """``trials`` killed runs, then one that finishes; the epoch count leaves room for them."""
    rng = random.Random(seed)
    record = root / "record"
    record.mkdir(parents=True)
    epochs = 2 + trials // 2  # a trial keeps about 4.5 steps, an epoch is 6 to 18 steps
    base = {"dir": str(root / "ckpt"), "record": str(record), "dataset_len": DATASET_LEN, "batch_size": BATCH,
            "seed": seed, "epochs": epochs, "save_every": SAVE_EVERY, "keep": 3}
    runs = 0
    for number in range(trials + 1):
        world_size = rng.randint(1, 3)
        last = number == trials
        kind = None if last else KINDS[number % len(KINDS)]
        kill = None if last else (kind, rng.randint(SAVE_EVERY, 3 * SAVE_EVERY), rng.randrange(world_size))
        committed = [info.step for info in list_checkpoints(base["dir"])]
        args = dict(base, run=runs, kill=kill, ready=str(root / f"ready{runs}"))
        killed = _run(world_size, args, root / f"run{runs}.log")
        started = int((record / f"run{runs}-start.txt").read_text())
        assert started == (committed[-1] if committed else 0), f"run {runs} resumed at {started}, not {committed}"
        summary.checkpoints_verified += bool(committed)
        runs += 1
        summary.trials["kill"] += 1
        if killed:
            summary.faults[f"kill.{kind}"] += 1
        elif not last:
            break  # the job finished before its kill point: nothing is left to train
    _account(record, runs, epochs, summary)
