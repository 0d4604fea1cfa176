"""A torchrun worker that reports how it is tied to its launcher (tests/test_end_with_launcher.py):
its own parent-death signal and that of one of its DataLoader workers, started with spawn, which
imports dist_resume again. ``python launcher_probe.py OUT_DIR [--fail-first]``: with
``--fail-first``, rank 1 fails in torchrun's first attempt (after rank 0 reported), so that
torchrun restarts the workers."""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import dist_resume  # noqa: F401  (what is tested: the import)


def parent_death_signal() -> int:
    found = ctypes.c_int(-1)
    assert ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(found)) == 0  # PR_GET_PDEATHSIG
    return found.value


class Probe(Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([parent_death_signal(), os.getpid(), os.getppid()])


def main() -> None:
    out, fail_first = sys.argv[1], "--fail-first" in sys.argv
    loader = DataLoader(Probe(), batch_size=None, num_workers=1, multiprocessing_context="spawn")
    signal, worker, worker_parent = next(iter(loader)).tolist()
    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    report = {"signal": parent_death_signal(), "pid": os.getpid(), "parent": os.getppid(),
              "loader_worker_signal": signal, "loader_worker_parent_is_me": worker_parent == os.getpid()}
    with open(os.path.join(out, f"attempt{attempt}.rank{rank}.json"), "w") as file:
        json.dump(report, file)
    if fail_first and attempt == "0" and rank == "1":
        while not os.path.exists(os.path.join(out, "attempt0.rank0.json")):  # rank 0 reported before the failure
            time.sleep(0.01)
        raise SystemExit(3)


if __name__ == "__main__":
    main()
