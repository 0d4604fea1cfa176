"""Per-step cost of capturing an IterableDataset's worker state, side by side, interleaved, medians.

    python benchmarks/stream_snapshots.py [--batches 400] [--reps 5] [--workers 2] [--state-kb 5]

A stateful stream of small tensors whose `state_dict()` is its position plus `--state-kb` KB
(the size of a torch.Generator state: 5 KB). Per repetition, in turn, `--batches` batches of:

- torch's DataLoader (baseline);
- ResumableDataLoader over the same stream without state methods (no snapshots: a resume
  would replay);
- ResumableDataLoader with `snapshot_every` = 16 (the default) and = 1 (a state round-trip
  per batch).

Prints the median iterations per second of each, and its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dist_resume import ResumableDataLoader  # noqa: E402


class Stream(IterableDataset):
    """Items of 64 floats, split by worker; stateless."""

    def __init__(self, length: int, state_kb: int) -> None:
        self.length = length
        self.position = 0
        self.extra = torch.zeros(state_kb * 1024, dtype=torch.uint8)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for index in range(self.position * workers + worker, self.length, workers):
            self.position += 1
            yield torch.full((64,), float(index))


class StatefulStream(Stream):
    def state_dict(self) -> dict:
        return {"position": self.position, "extra": self.extra.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self.extra = state["extra"]


def iterations_per_second(make, batches: int) -> float:
    loader = make()
    start = time.perf_counter()
    for count, _ in enumerate(loader, start=1):
        if count == batches:
            break
    return batches / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=400)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--state-kb", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    length = args.batches * args.batch_size * 2  # never exhausted within a timing
    common = dict(batch_size=args.batch_size, num_workers=args.workers)
    variants = {
        "torch DataLoader": lambda: DataLoader(Stream(length, args.state_kb), **common),
        "no snapshots": lambda: ResumableDataLoader(Stream(length, args.state_kb), **common),
        "snapshot_every=16": lambda: ResumableDataLoader(StatefulStream(length, args.state_kb), snapshot_every=16, **common),
        "snapshot_every=1": lambda: ResumableDataLoader(StatefulStream(length, args.state_kb), snapshot_every=1, **common),
    }
    timings: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.reps):
        for name, make in variants.items():
            timings[name].append(iterations_per_second(make, args.batches))
    baseline = statistics.median(timings["torch DataLoader"])
    print(f"{args.batches} batches of {args.batch_size}, {args.workers} workers, state {args.state_kb} KB, "
          f"median of {args.reps} interleaved repetitions (worker start-up included)")
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"  {name:<20} {median:9.1f} it/s   x{median / baseline:.2f}")


if __name__ == "__main__":
    main()
