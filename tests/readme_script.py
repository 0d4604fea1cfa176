"""The README's training script ("## A training script"), taken from README.md as it stands
and run under plain torchrun, with what the tests need added around it: each rank records
the samples of every batch it trains (found by their values in the script's own dataset) and
its pid, and may pause before a given step until it is released.

Only lines are added, none of the README's is changed; if the README's script loses the
lines the additions hang on, the tests fail here rather than test something else."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dist_resume.demo.job import free_port, job_env

ROOT = Path(__file__).resolve().parents[1]
HEADING = "## A training script"
RECORDS_ENV = "README_RECORDS"  # the directory of this launch's records
PAUSE_AT_ENV = "README_PAUSE_AT"  # the global step each rank pauses before
AFTER_LAUNCHER_ENV = "README_AFTER_LAUNCHER"  # "1": the pause lasts until the rank's launcher is gone ...
GO_ENV = "README_GO"  # ... and (or) until this file exists

# Added before the script: defines _record, called by every rank before each training step.
PREAMBLE = f'''\
import json as _json, os as _os, time as _time
import torch as _torch, torch.distributed as _dist

_RECORDS = _os.environ["{RECORDS_ENV}"]
_PAUSE_AT = int(_os.environ.get("{PAUSE_AT_ENV}", "-1"))
_LAUNCHER = _os.getppid()


def _record(batch, epoch, step):
    rank = _dist.get_rank()
    indices = [int(_torch.nonzero((dataset == row).all(1))[0]) for row in batch]
    if step == _PAUSE_AT:
        _pause(rank)
    with open(_os.path.join(_RECORDS, f"rank{{rank}}.jsonl"), "a") as out:
        out.write(_json.dumps({{"epoch": epoch, "step": step, "indices": indices, "pid": _os.getpid(),
                               "world_size": _dist.get_world_size()}}) + "\\n")


def _pause(rank):
    with open(_os.path.join(_RECORDS, f"paused.{{rank}}"), "w") as out:
        out.write(str(_os.getpid()))
    go = _os.environ.get("{GO_ENV}")
    while (_os.environ.get("{AFTER_LAUNCHER_ENV}") == "1" and _os.getppid() == _LAUNCHER) or (go and not _os.path.exists(go)):
        _time.sleep(0.02)

'''


def readme_script() -> str:
    """The first python block after the README's heading "## A training script"."""
    text = (ROOT / "README.md").read_text()
    assert text.count(HEADING + "\n") == 1, f"README.md has no single heading {HEADING!r}"
    after = text.split(HEADING + "\n", 1)[1]
    match = re.search(r"^```python\n(.*?)^```$", after, re.DOTALL | re.MULTILINE)
    assert match, f"no python block after {HEADING!r} in README.md"
    return match.group(1)


def instrumented(script: str) -> str:
    """``script`` with the recording preamble, and a call to it first thing in the loop over
    the loader's batches (the step the batch is for: the script counts steps after them)."""
    lines = script.splitlines()
    loops = [number for number, line in enumerate(lines) if re.match(r"\s*for batch in loader:", line)]
    assert len(loops) == 1, "the README's script has no single `for batch in loader:` loop"
    assert re.search(r"^\s+step \+= 1\b", script, re.MULTILINE), "the README's script does not count `step += 1`"
    assert re.search(r"^for epoch in range\(", script, re.MULTILINE), "the README's script has no epoch loop"
    loop = lines[loops[0]]
    body = " " * (len(loop) - len(loop.lstrip()) + 4)
    lines.insert(loops[0] + 1, f"{body}_record(batch, epoch, step + 1)")
    return PREAMBLE + "\n".join(lines) + "\n"


def dataset_size(script: str) -> int:
    match = re.search(r"^dataset = torch\.randn\((\d+), \d+\b", script, re.MULTILINE)
    assert match, "the README's script no longer builds its dataset with torch.randn(N, D, ...)"
    return int(match.group(1))


@dataclass
class Launch:
    """One `torchrun --nproc-per-node N train.py` of the README, in ``workdir``."""

    process: subprocess.Popen
    records: Path
    log: Path

    def paused_pids(self, ranks: int, timeout: float) -> list[int]:
        """Once every rank wrote that it paused: their pids."""
        deadline = time.monotonic() + timeout
        files = [self.records / f"paused.{rank}" for rank in range(ranks)]
        while not all(file.exists() and file.read_text() for file in files):
            assert self.process.poll() is None, f"the job ended ({self.process.returncode}) before its pause:\n{self.output()}"
            assert time.monotonic() < deadline, f"the job did not pause within {timeout} s:\n{self.output()}"
            time.sleep(0.05)
        return [int(file.read_text()) for file in files]

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            raise AssertionError(f"the job did not end within {timeout} s:\n{self.output()}") from None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def kill_launcher(self) -> None:
        """``kill -9`` of torchrun alone, as a user (or the OOM killer) does."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()


def launch(workdir: Path, name: str, nproc: int, env: dict[str, str] | None = None) -> Launch:
    """``torchrun --nproc-per-node N train.py`` in ``workdir`` (plain torchrun: its static
    rendezvous, on a free loopback port instead of its default 29500)."""
    records = workdir / "records" / name
    records.mkdir(parents=True)
    torchrun = Path(sys.executable).parent / "torchrun"
    log = workdir / f"{name}.log"
    with open(log, "w") as out:
        process = subprocess.Popen([str(torchrun), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
                                    "--master-port", str(free_port()), "train.py"], cwd=workdir, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   env=job_env({RECORDS_ENV: str(records), **(env or {})}))
    return Launch(process, records, log)


def records(launch_records: Path) -> list[dict]:
    """Every batch the ranks of one launch recorded, in the order of their steps."""
    found = []
    for file in sorted(launch_records.glob("rank*.jsonl")):
        rank = int(file.stem[len("rank"):])
        found += [{**json.loads(line), "rank": rank} for line in file.read_text().splitlines()]
    return sorted(found, key=lambda record: (record["step"], record["rank"]))


def lineage(launches: Sequence[list[dict]]) -> list[dict]:
    """The batches that count: each launch's up to the step the next one resumed after (the
    steps a kill rolled back were trained again by the next launch)."""
    kept = []
    for this, following in zip(launches, [*launches[1:], None]):
        resumed_after = following[0]["step"] - 1 if following else float("inf")
        kept += [record for record in this if record["step"] <= resumed_after]
    return kept


def check_every_sample_once_per_epoch(kept: list[dict], size: int, batch_size: int) -> dict[int, int]:
    """G2 over the README's epochs: every sample trained in each epoch, every global step
    trained by every rank, and the only repeats are the padding of the epoch's final global
    step (`even_batches`: its batches made equal, fewer repeats than ranks); returns the
    repeats per epoch."""
    repeats = {}
    for epoch in sorted({record["epoch"] for record in kept}):
        batches = [record for record in kept if record["epoch"] == epoch]
        steps = sorted({record["step"] for record in batches})
        assert steps == list(range(steps[0], steps[-1] + 1)), f"epoch {epoch}: steps {steps} are not consecutive"
        for step in steps:
            ranks = [record for record in batches if record["step"] == step]
            world = ranks[0]["world_size"]
            assert sorted(record["rank"] for record in ranks) == list(range(world)), f"step {step}: ranks {ranks}"
            sizes = {len(record["indices"]) for record in ranks}
            assert sizes == {batch_size} or step == steps[-1] and len(sizes) == 1, f"step {step}: batches of {sizes}"
        counts = Counter(index for record in batches for index in record["indices"])
        assert sorted(counts) == list(range(size)), f"epoch {epoch}: samples lost: {sorted(set(range(size)) - set(counts))}"
        extra = Counter({index: count - 1 for index, count in counts.items() if count > 1})
        final = [record for record in batches if record["step"] == steps[-1]]
        assert not extra - Counter(index for record in final for index in record["indices"]), \
            f"epoch {epoch}: samples repeated outside the final step's padding: {extra}"
        assert sum(extra.values()) < final[0]["world_size"], f"epoch {epoch}: more repeats than padding: {extra}"
        repeats[epoch] = sum(extra.values())
    return repeats
