"""B7R: seconds from building a ShardedStream's loader to its first batch after
`load_state_dict` at 10% and at 90% of an epoch, in a new process, for JSONL, Parquet and
WebDataset tar shards on local disk and on S3 (moto), side by side in one run: with the
counts kept by an earlier start (the default), with `counts_cache=None` (every shard
counted, as before issue 35), with `lengths=` given (no count at all: the floor), and a
plain torch DataLoader that replays the epoch to the position (litdata and MosaicML
streaming are not in the bench extra). And a cold S3 epoch of JSONL, a new process and loader reading the whole epoch, against the plain
reader (issue 35: >= 0.95x).

Each measurement runs in a child process (`python -m benchmarks.b7_resume_time JSON`)
that imports torch, dist_resume and pyarrow before its clock starts: the time is the
loader's, not the interpreter's start-up.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from .report import FigureResult
from .timing import Stats, interleaved

SHARDS = 40
BATCH_SIZE = 64
FORMATS = ("jsonl", "parquet", "tar")
POSITIONS = (0.1, 0.9)
TARGET_SECONDS = 0.3
TARGET_RATIO = 0.95
KEPT, COUNTED, GIVEN = "counts kept (default)", "counts_cache=None: counted", "lengths= given"
REPLAY = "plain IterableDataset: replay to the position"
ROOT = Path(__file__).resolve().parents[1]


def records(shard: int, count: int) -> list[tuple[int, bytes]]:
    """An int64 id and 256 random bytes per record (the issue's workload)."""
    rng = random.Random(shard)
    return [(shard * count + i, rng.randbytes(256)) for i in range(count)]


def shard_bytes(fmt: str, rows: list[tuple[int, bytes]]) -> bytes:
    from tests.format_files import jsonl_bytes, parquet_bytes, tar_bytes

    if fmt == "jsonl":
        return jsonl_bytes([{"id": id_, "data": data.hex()} for id_, data in rows])
    if fmt == "parquet":
        return parquet_bytes([{"id": id_, "data": data} for id_, data in rows], row_group_size=1024)
    return tar_bytes([(f"{id_:09}.{ext}", value) for id_, data in rows for ext, value in
                      (("id", str(id_).encode()), ("bin", data))])


def reader_of(fmt: str) -> Any:
    from dist_resume.streams.formats import JsonlReader, ParquetReader, WebDatasetReader

    return {"jsonl": JsonlReader(), "parquet": ParquetReader(), "tar": WebDatasetReader()}[fmt]


def collate(items: list[Any]) -> int:
    return len(items)


# The child: one timed start, printed as seconds on its last line.

def child(task: dict[str, Any]) -> float:
    import pyarrow.parquet  # noqa: F401  imported before the clock, as in a job that reads Parquet
    import torch
    from torch.utils.data import DataLoader

    from dist_resume import ResumableDataLoader, ShardedStream
    from benchmarks.b7_streams import PlainShards

    torch.set_num_threads(1)
    options, reader = task["options"], reader_of(task["format"])
    began = time.perf_counter()
    if task["mode"] in ("plain", "replay"):
        batches = iter(DataLoader(PlainShards(task["urls"], reader, options), batch_size=BATCH_SIZE, collate_fn=collate))
        if task["mode"] == "replay":  # what a job without resumable streams does: read and drop the trained batches
            for _ in range(task["skip"] + 1):
                next(batches)
            return time.perf_counter() - began
        items = sum(batches)
        assert items == task["items"], items
        return time.perf_counter() - began
    settings: dict[str, Any] = {"counts_cache": task["cache"]}
    if task["lengths"] is not None:
        settings["lengths"] = task["lengths"]
    stream = ShardedStream(task["urls"], reader, shuffle=False, storage_options=options, **settings)
    loader = ResumableDataLoader(stream, batch_size=BATCH_SIZE, collate_fn=collate)
    if task["mode"] == "epoch":
        items = sum(loader)
        assert items == task["items"], items
        return time.perf_counter() - began
    loader.load_state_dict(torch.load(task["state"]))
    next(iter(loader))
    return time.perf_counter() - began


def timed(task: dict[str, Any]) -> float:
    run = subprocess.run([sys.executable, "-m", "benchmarks.b7_resume_time", json.dumps(task)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1800, check=False)
    if run.returncode:
        raise RuntimeError(f"B7R child failed: {run.stderr[-3000:]}")
    return float(run.stdout.split()[-1])


# The parent: shards, states, and the interleaved children.

def write_all(root: str, options: dict[str, Any], per_shard: int) -> dict[str, list[str]]:
    import fsspec

    urls: dict[str, list[str]] = {}
    for fmt in FORMATS:
        urls[fmt] = []
        for shard in range(SHARDS):
            url = f"{root}/{fmt}/shard-{shard:03}.{fmt}"
            with fsspec.open(url, "wb", **options) as file:
                file.write(shard_bytes(fmt, records(shard, per_shard)))
            urls[fmt].append(url)
    return urls


def saved_state(urls: list[str], fmt: str, options: dict[str, Any], lengths: list[int], fraction: float,
                path: str) -> int:
    """Saves at `fraction` of the epoch's batches to `path`; returns the batches trained."""
    import torch

    from dist_resume import ResumableDataLoader, ShardedStream

    stream = ShardedStream(urls, reader_of(fmt), shuffle=False, storage_options=options, lengths=lengths)
    loader = ResumableDataLoader(stream, batch_size=BATCH_SIZE, collate_fn=collate)
    trained = int(len(loader) * fraction)
    loader.skip(trained)
    torch.save(loader.state_dict(), path)
    return trained


def run(quick: bool) -> list[FigureResult]:
    from .b7_streams import local_directory, moto_bucket

    per_shard = 160 if quick else 1280  # SHARDS * per_shard a multiple of the batch: no padding
    reps = 1 if quick else 3
    resume = FigureResult("B7R", f"seconds from building the loader to the first batch after a load, new process, "
                          f"{SHARDS} shards per format (lower is better)", "s", log_scale=True)
    epoch = FigureResult("B7R-epoch", "a cold epoch of JSONL shards on S3 (moto), new process and loader, 0 workers: "
                         "records/s (higher is better)", "records/s")
    sources = {"local": local_directory, "s3 (moto)": moto_bucket}
    with tempfile.TemporaryDirectory(prefix="dist-resume-b7r-") as scratch, ExitStack() as stack:
        for source, place in sources.items():
            root, options = stack.enter_context(place())
            urls = write_all(root, options, per_shard)
            lengths = [per_shard] * SHARDS
            cache = os.path.join(scratch, f"counts-{len(resume.rows)}")
            cases: dict[tuple[str, str], Any] = {}
            for fmt in FORMATS:
                base = {"format": fmt, "urls": urls[fmt], "options": options, "items": per_shard * SHARDS}
                timed({**base, "mode": "epoch", "cache": cache, "lengths": None})  # the first start keeps the counts
                for fraction in POSITIONS:
                    state = os.path.join(scratch, f"{source}-{fmt}-{fraction}.pt".replace(" ", ""))
                    trained = saved_state(urls[fmt], fmt, options, lengths, fraction, state)
                    resumed = {**base, "mode": "resume", "state": state}
                    case = f"{source}, {fmt}, at {fraction:.0%}"
                    cases[(case, KEPT)] = {**resumed, "cache": cache, "lengths": None}
                    cases[(case, COUNTED)] = {**resumed, "cache": None, "lengths": None}
                    cases[(case, GIVEN)] = {**resumed, "cache": None, "lengths": lengths}
                    cases[(case, REPLAY)] = {**base, "mode": "replay", "skip": trained}
            if source != "local":
                jsonl = {"format": "jsonl", "urls": urls["jsonl"], "options": options, "items": per_shard * SHARDS,
                         "lengths": None}
                cases[("cold epoch", "ShardedStream, counts kept")] = {**jsonl, "mode": "epoch", "cache": cache}
                cases[("cold epoch", "ShardedStream, counts_cache=None")] = {**jsonl, "mode": "epoch", "cache": None}
                cases[("cold epoch", "plain IterableDataset")] = {**jsonl, "mode": "plain", "cache": None}
            stats = interleaved({key: (lambda task=task: timed(task)) for key, task in cases.items()}, reps, warmup=0)
            for (case, series), value in stats.items():
                if case == "cold epoch":
                    items = per_shard * SHARDS
                    epoch.add(f"{source}, 0 workers", series, Stats(items / value.median, items / value.high,
                                                                     items / value.low, value.reps))
                    continue
                resume.add(case, series, value)
                if series == KEPT:
                    resume.check(case, value.median, f"<= {TARGET_SECONDS} s", value.median <= TARGET_SECONDS)
    case = "s3 (moto), 0 workers"
    ratio = epoch.value(case, "ShardedStream, counts kept").median / epoch.value(case, "plain IterableDataset").median
    epoch.check("cold S3 JSONL epoch vs the plain reader", ratio, f">= {TARGET_RATIO}", ratio >= TARGET_RATIO)
    resume.notes += [
        f"{SHARDS} shards per format of {per_shard:,} records (an int64 id and 256 random bytes: JSONL as hex text, "
        "Parquet in row groups of 1,024, tar as key.id and key.bin members written by tarfile), batch size "
        f"{BATCH_SIZE}, 0 workers, shuffle=False. The state is taken after skip() to 10% or 90% of the epoch's "
        "batches; each start runs in a new process whose clock starts after its imports (torch, dist_resume, "
        "pyarrow) and stops at the first batch after load_state_dict.",
        "'counts kept': the counts cache filled by an earlier start in another process; the resume stats (local) or "
        "HEADs (S3) every shard to check its identity and reads only the shards it trains from. "
        "'counts_cache=None': every shard counted at each start (the only behaviour before issue 35). "
        "'lengths= given': nothing counted or checked. 'replay': torch's DataLoader over a plain IterableDataset "
        "(B7's recipe) reads and drops the trained batches, then yields the next one: a resume without resumable "
        "streams. litdata and MosaicML streaming are not in the bench extra, so not measured here.",
        "moto runs in the benchmark's process, the children reach it over loopback.",
    ]
    epoch.notes.append(
        "Each epoch in a new process: from building the loader to its last batch. 'counts kept': the counts cache "
        "of an earlier start; 'counts_cache=None': the count pass reads every JSONL byte before the epoch reads "
        "them again; the plain reader: torch's DataLoader over an IterableDataset that reads the same shards with "
        "the same reader, one after another (B7's recipe).")
    return [resume, epoch]


if __name__ == "__main__":
    print(child(json.loads(sys.argv[1])))
