"""B9: batches/s with stragglers, in_order=False vs in_order=True (issue 22)."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from torch.utils.data import DataLoader, Dataset

from dist_resume import ResumableDataLoader
from dist_resume.streams import ShardedStream

from .report import FigureResult
from .timing import interleaved
from .workloads import epoch_rate

UNORDERED, ORDERED = "ResumableDataLoader in_order=False", "ResumableDataLoader in_order=True"
TORCH_UNORDERED, TORCH_ORDERED = "torch DataLoader in_order=False", "torch DataLoader in_order=True"
_WORKERS, _BATCH, _EVERY, _DELAY = 4, 4, 16, 0.04


class StragglerDataset(Dataset):
    """Sample i is the int i; one sample in 16 (shuffled over the epoch) takes 40 ms: a large
    image, a remote read."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        if index % _EVERY == _EVERY - 1:
            time.sleep(_DELAY)
        return index


class StragglerReader:
    """Reads a JSONL shard of item ids; one item in 16 takes 40 ms to read (a large record,
    a remote fetch)."""

    def __call__(self, file):
        for line in file:
            item = json.loads(line)
            if item % _EVERY == _EVERY - 1:
                time.sleep(_DELAY)
            yield item


def straggler_stream(root: Path, items: int, shards: int = 8) -> ShardedStream:
    """`items` ids, consecutive ones in one JSONL file of `shards` (so every shard holds as
    many stragglers), read by StragglerReader (counts given: counting would read every
    straggler)."""
    urls, per_shard = [], items // shards
    for shard in range(shards):
        urls.append(str(root / f"shard-{shard}.jsonl"))
        Path(urls[-1]).write_text("".join(f"{i}\n" for i in range(shard * per_shard, (shard + 1) * per_shard)))
    return ShardedStream(urls, StragglerReader(), seed=0, lengths=[per_shard] * shards)


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B9", "batches/s with stragglers, out-of-order delivery (higher is better)", "batches/s")
    dataset = StragglerDataset(512 if quick else 1024)
    shared = dict(batch_size=_BATCH, num_workers=_WORKERS)
    with tempfile.TemporaryDirectory() as root:
        stream = straggler_stream(Path(root), len(dataset))
        cases = {
            f"map-style, 1 sample in {_EVERY} takes {_DELAY * 1000:.0f} ms, {_WORKERS} workers, batch {_BATCH}": {
                UNORDERED: ResumableDataLoader(dataset, seed=0, in_order=False, shuffle=True, **shared),
                ORDERED: ResumableDataLoader(dataset, seed=0, shuffle=True, **shared),
                TORCH_UNORDERED: DataLoader(dataset, in_order=False, shuffle=True, **shared),
                TORCH_ORDERED: DataLoader(dataset, shuffle=True, **shared),
            },
            f"ShardedStream (8 shards), 1 item in {_EVERY} takes {_DELAY * 1000:.0f} ms to read, {_WORKERS} workers, "
            f"batch {_BATCH}": {
                UNORDERED: ResumableDataLoader(stream, in_order=False, **shared),
                ORDERED: ResumableDataLoader(stream, **shared),
                TORCH_UNORDERED: DataLoader(stream, in_order=False, **shared),
                TORCH_ORDERED: DataLoader(stream, **shared),
            },
        }
        stats = interleaved({(case, name): (lambda loader=loader: epoch_rate(loader))
                             for case, loaders in cases.items() for name, loader in loaders.items()},
                            3 if quick else 9)
    for (case, name), value in stats.items():
        result.add(case, name, value)
    for case, kind in zip(cases, ("map-style", "ShardedStream")):
        for other, target in ((ORDERED, 1.3), (TORCH_UNORDERED, 0.9)):
            ratio = stats[case, UNORDERED].median / stats[case, other].median
            result.check(f"{kind}: {UNORDERED} vs {other}", ratio, f">= {target}", ratio >= target)
    result.notes.append(
        f"{len(dataset):,} samples (items), shuffled; each epoch timed from iter() (worker start included) to "
        "the last batch; the eight loaders interleaved in one run. torch's DataLoader iterates the same "
        "ShardedStream as a plain IterableDataset (each worker its own canonical streams, no resume). With "
        "in_order=False a resume trains every sample of the epoch exactly once, in another order than an "
        "uninterrupted run (docs/slow-steps.md).")
    return [result]
