"""What each rank of the demo job trained on, step by step, written as it trains.

Layout under the record directory: one ``run_<k>/`` per start of the job (a launch or an
elastic restart), holding ``run.json`` (written by rank 0: world size, per-rank batch size,
the step it resumed from) and ``rank<r>.jsonl`` (one line per step the rank trained).
Lines are flushed before the step's checkpoint is saved, so a kill never loses a
committed step's record.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dist_resume.positions.epoch_order import EpochOrder

RUN_FILE = "run.json"


def fingerprint(sample: torch.Tensor) -> str:
    """A short digest of a sample's exact values."""
    data = sample.detach().cpu().contiguous().numpy().tobytes()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


class EpochPositions:
    """Maps dataset indices back to their positions in an epoch's order (one epoch cached)."""

    def __init__(self, length: int, seed: int, shuffle: bool) -> None:
        self.length, self.seed, self.shuffle = length, seed, shuffle
        self._epoch: int | None = None
        self._inverse = torch.empty(0, dtype=torch.int64)

    def __call__(self, epoch: int, indices: Sequence[int]) -> list[int]:
        if epoch != self._epoch:
            order = torch.tensor(EpochOrder(self.length, self.seed, epoch, self.shuffle).indices(
                torch.arange(self.length)), dtype=torch.int64)
            self._inverse = torch.empty(self.length, dtype=torch.int64)
            self._inverse[order] = torch.arange(self.length)
            self._epoch = epoch
        return self._inverse[torch.as_tensor(list(indices), dtype=torch.int64)].tolist()


def start_run(directory: str | os.PathLike, world_size: int, batch_size: int, resumed_from: int) -> int:
    """Create the next ``run_<k>/`` with its ``run.json`` (on rank 0 only); return ``k``."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    number = len(list(root.glob("run_*")))
    while True:
        try:
            (root / f"run_{number:03d}").mkdir()
            break
        except FileExistsError:
            number += 1
    header = {"world_size": world_size, "batch_size": batch_size, "resumed_from": resumed_from,
              "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))}
    (root / f"run_{number:03d}" / RUN_FILE).write_text(json.dumps(header))
    return number


class Recorder:
    """Appends one rank's steps to ``run_<k>/rank<r>.jsonl``."""

    def __init__(self, directory: str | os.PathLike, run: int, rank: int, positions: EpochPositions) -> None:
        self._file = open(Path(directory) / f"run_{run:03d}" / f"rank{rank}.jsonl", "a", encoding="utf-8")
        self._positions = positions

    def write(self, step: int, epoch: int, indices: Sequence[int], samples: torch.Tensor,
              padding: int, loss: float) -> None:
        """Record global ``step``: its samples, the last ``padding`` of which are padding (G2)."""
        line = {"step": step, "epoch": epoch, "indices": list(indices),
                "positions": self._positions(epoch, indices), "padding": padding,
                "fingerprints": [fingerprint(sample) for sample in samples], "loss": loss}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class StepRecord:
    """One rank's batch of one global step."""

    step: int
    epoch: int
    rank: int
    positions: list[int]
    indices: list[int]
    padding: int
    fingerprints: list[str]


@dataclass(frozen=True)
class Run:
    """One start of the job and every step its ranks recorded."""

    number: int
    world_size: int
    batch_size: int
    resumed_from: int
    restart: int
    steps: list[StepRecord]

    @property
    def last_step(self) -> int:
        return max((record.step for record in self.steps), default=self.resumed_from)


def read_runs(directory: str | os.PathLike) -> list[Run]:
    """Every run recorded under ``directory``, in start order."""
    runs = []
    for run_dir in sorted(Path(directory).glob("run_*")):
        header_file = run_dir / RUN_FILE
        if not header_file.exists():
            continue  # rank 0 was killed between mkdir and the header: it trained nothing
        header = json.loads(header_file.read_text())
        steps = []
        for rank_file in sorted(run_dir.glob("rank*.jsonl")):
            rank = int(rank_file.stem.removeprefix("rank"))
            for line in rank_file.read_text().splitlines():
                if not line.endswith("}"):
                    continue  # a line cut by the kill: never part of a committed step
                data = json.loads(line)
                steps.append(StepRecord(data["step"], data["epoch"], rank, data["positions"],
                                        data["indices"], data["padding"], data["fingerprints"]))
        runs.append(Run(int(run_dir.name.removeprefix("run_")), header["world_size"], header["batch_size"],
                        header["resumed_from"], header["restart"], steps))
    return runs
