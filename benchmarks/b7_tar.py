"""B7T: records/s of WebDataset tar shards (issue 35 point 2), side by side in one run:
ShardedStream with WebDatasetReader through ResumableDataLoader, webdataset's own
`WebDataset` pipeline, and torch's DataLoader over a plain tarfile reader (the usual
per-worker shard recipe), on shards written by webdataset's TarWriter (a pax header before
every file); beside them the disk's own read rate of the same files, cold and warm, and
the time to count the shards' samples."""

from __future__ import annotations

import os
import tarfile
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from dist_resume import ResumableDataLoader, ShardedStream, WebDatasetReader

from .b7_streams import PlainShards, items_per_second
from .report import FigureResult
from .timing import Stats, interleaved, seconds
from .workloads import RECORD_BYTES, write_webdataset_shards

BATCH_SIZE = 64
TARGET = 10.0  # issue 35: >= 10x webdataset's records/s at 0 workers
OURS, OURS_SHUFFLED = "ResumableDataLoader + ShardedStream(WebDatasetReader)", "the same, shuffle=True"
WEBDATASET, TARFILE = "webdataset.WebDataset + torch DataLoader", "torch DataLoader + plain tarfile reader"


def tarfile_samples(file: Any) -> Iterator[dict[str, Any]]:
    """A plain tarfile reader: consecutive files of one key are one sample (what the
    previous WebDatasetReader did, and webdataset's grouping, without their checks)."""
    sample: dict[str, Any] = {}
    with tarfile.open(fileobj=file, mode="r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, extension = member.name.partition(".")
            if sample.get("__key__") != key:
                if sample:
                    yield sample
                sample = {"__key__": key}
            sample[extension] = tar.extractfile(member).read()
    if sample:
        yield sample


def tarfile_count(url: str) -> int:
    """The samples of a shard counted as the previous WebDatasetReader counted them: tarfile's
    headers, its data seeked over."""
    with tarfile.open(url, mode="r:*") as tar:
        keys = [member.name.partition(".")[0] for member in tar if member.isfile()]
    return sum(1 for index, key in enumerate(keys) if index == 0 or key != keys[index - 1])


def loaders(urls: list[str], workers: int) -> dict[str, DataLoader]:
    import webdataset

    return {
        OURS: ResumableDataLoader(ShardedStream(urls, WebDatasetReader(), shuffle=False), batch_size=BATCH_SIZE,
                                  num_workers=workers),
        OURS_SHUFFLED: ResumableDataLoader(ShardedStream(urls, WebDatasetReader()), batch_size=BATCH_SIZE,
                                           num_workers=workers),
        WEBDATASET: DataLoader(webdataset.WebDataset(urls, shardshuffle=False), batch_size=BATCH_SIZE,
                               num_workers=workers),
        TARFILE: DataLoader(PlainShards(urls, tarfile_samples, {}), batch_size=BATCH_SIZE, num_workers=workers),
    }


def evict(urls: list[str]) -> None:
    """Drops the files' pages from the page cache (their next read comes from the disk)."""
    for url in urls:
        descriptor = os.open(url, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def read_rate(urls: list[str], cold: bool) -> float:
    """MB/s of a plain Python read of the files in 1 MiB reads, from the page cache or the disk."""
    if cold:
        evict(urls)
    total = 0
    began = time.perf_counter()
    for url in urls:
        with open(url, "rb", buffering=0) as file:
            while chunk := file.read(1 << 20):
                total += len(chunk)
    return total / (time.perf_counter() - began) / 1e6


def run(quick: bool) -> list[FigureResult]:
    shards, records = (16, 1000) if quick else (40, 5000)
    reps = 2 if quick else 4  # epochs of seconds to minutes: 4 rounds bring the medians' spread to a few percent
    result = FigureResult("B7T", f"records/s of {shards} WebDataset tar shards, {shards * records:,} records "
                          "(higher is better)", "records/s")
    disk = FigureResult("B7T-disk", "the same files read by a plain Python loop vs by the readers", "MB/s")
    counting = FigureResult("B7T-count", f"time to count the samples of the {shards} shards", "s")
    with tempfile.TemporaryDirectory(prefix="dist-resume-b7t-") as directory:
        began = time.perf_counter()
        urls = write_webdataset_shards(directory, [records] * shards)
        written = time.perf_counter() - began
        size = sum(os.path.getsize(url) for url in urls)
        for workers in (0, 2):
            case = f"local files, {workers} workers"
            runs = {name: (lambda loader=loader: items_per_second(loader, shards * records))
                    for name, loader in loaders(urls, workers).items()}
            stats = interleaved(runs, reps if not workers else max(reps - 1, 2))
            for name, value in stats.items():
                result.add(case, name, value)
            ratio = stats[OURS].median / stats[WEBDATASET].median
            result.check(f"{case}: vs webdataset", ratio, f">= {TARGET:g}" if not workers else "(no target)",
                         ratio >= TARGET if not workers else None)
            result.check(f"{case}: vs plain tarfile", stats[OURS].median / stats[TARFILE].median, "(no target)", None)
            if not workers:  # records/s as MB/s of the shards
                for name in (OURS, WEBDATASET):
                    rate = stats[name]
                    disk.add("the readers, 0 workers (warm)", name,
                             Stats(*(value * size / (shards * records) / 1e6 for value in (rate.median, rate.low, rate.high)),
                                   rate.reps))
        rates = interleaved({"warm (page cache)": lambda: read_rate(urls, cold=False),
                             "cold (evicted with posix_fadvise)": lambda: read_rate(urls, cold=True)}, reps)
        for name, value in rates.items():
            disk.add("plain read, 1 MiB reads", name, value)
        counts = interleaved({"WebDatasetReader.count": lambda: seconds(lambda: counted(urls, records)),
                              "tarfile (the previous WebDatasetReader.count)":
                                  lambda: seconds(lambda: counted(urls, records, tarfile_count))}, reps)
        for name, value in counts.items():
            counting.add(f"{shards} shards", name, value)
    result.notes += [
        f"{shards} shards of {records:,} records, each an int64 id ('id', 8 bytes) and 256 random bytes ('bin'), "
        f"written by webdataset's TarWriter in {written:.0f} s: a pax header before every file, {size / 1e6:,.0f} MB "
        f"({size / (shards * records):,.0f} bytes a record). Batch size {BATCH_SIZE}, default collate; each epoch timed "
        "from iter() (worker start included) to the last batch and checked to hold every record; medians of "
        f"{reps} interleaved rounds after a dropped warm-up round (which also counts the shards for ShardedStream).",
        "webdataset: WebDataset(urls, shardshuffle=False), its default decoding (none: bytes), split by worker. Plain "
        "tarfile: tarfile.open(mode='r|*') over each shard, one per worker in turn, consecutive files of a key "
        "grouped. Reads come from the page cache (the files were just written); B7T-disk gives the disk's own rate.",
    ]
    disk.notes.append("A plain loop of 1 MiB reads (buffering=0) over every shard: warm from the page cache, cold "
                      "after fsync and posix_fadvise(DONTNEED) of each file. The readers' rows are their records/s at 0 "
                      f"workers times the shard bytes a record ({RECORD_BYTES} bytes of data in 4,096 bytes of tar).")
    return [result, disk, counting]


def counted(urls: list[str], records: int, count: Any = None) -> None:
    """Counts every shard (by WebDatasetReader.count, or by `count(url)`); checks the counts."""
    reader = WebDatasetReader()
    for url in urls:
        if count is None:
            with open(url, "rb") as file:
                found = reader.count(file)
        else:
            found = count(url)
        assert found == records, (url, found)
