"""B7: items/s of a shard stream, ShardedStream through ResumableDataLoader vs torch's
DataLoader over a plain IterableDataset that reads the same shards with the same reader,
each worker its own shards (the usual recipe); from local files, from S3 on moto and from
S3 on Ceph RGW (a real object store on loopback), side by side in one run."""

from __future__ import annotations

import json
import logging
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import fsspec
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dist_resume import ResumableDataLoader
from dist_resume.streams import JsonlReader, ShardedStream

from .report import FigureResult
from .timing import interleaved, repetitions, seconds

SHARDS = 16
BATCH_SIZE = 64
OURS, OURS_SHUFFLED, TORCH = "ResumableDataLoader + ShardedStream", "the same, shuffle=True", "torch DataLoader + plain IterableDataset"
TARGET = 0.95  # issue 21: >= 0.95x torch's items/s


class PlainShards(IterableDataset):
    """The usual recipe: worker `w` of `W` reads shards `w, w + W, ...`, each opened with fsspec."""

    def __init__(self, urls: list[str], reader: Callable[[Any], Iterator[Any]], storage_options: dict[str, Any]) -> None:
        self.urls, self.reader, self.storage_options = urls, reader, storage_options

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for url in self.urls[worker::workers]:
            with fsspec.open(url, "rb", **self.storage_options) as file:
                yield from self.reader(file)


def write_shards(root: str, items_per_shard: int, storage_options: dict[str, Any]) -> list[str]:
    urls = []
    for shard in range(SHARDS):
        url = f"{root}/shard-{shard:03}.jsonl"
        with fsspec.open(url, "wb", **storage_options) as file:
            file.write(b"".join(json.dumps({"id": shard * items_per_shard + i, "text": "lorem ipsum " * 16}).encode() + b"\n"
                                for i in range(items_per_shard)))
        urls.append(url)
    return urls


def items_per_second(loader: DataLoader, items: int) -> float:
    counted = []
    elapsed = seconds(lambda: counted.append(sum(len(batch["id"]) for batch in loader)))
    assert counted == [items], (counted, items)  # every item, once: the loaders read the same data
    return items / elapsed


def loaders(urls: list[str], workers: int, options: dict[str, Any]) -> dict[str, DataLoader]:
    reader = JsonlReader()
    return {
        OURS: ResumableDataLoader(ShardedStream(urls, reader, shuffle=False, storage_options=options),
                                  batch_size=BATCH_SIZE, num_workers=workers),
        OURS_SHUFFLED: ResumableDataLoader(ShardedStream(urls, reader, storage_options=options),
                                           batch_size=BATCH_SIZE, num_workers=workers),
        TORCH: DataLoader(PlainShards(urls, reader, options), batch_size=BATCH_SIZE, num_workers=workers),
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def moto_bucket() -> Iterator[tuple[str, dict[str, Any]]]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        options = {"endpoint_url": f"http://127.0.0.1:{port}", "key": "bench", "secret": "bench-secret"}
        fsspec.filesystem("s3", **options).mkdir("bench-b7")
        yield "s3://bench-b7", options
    finally:
        server.stop()


@contextmanager
def ceph_bucket() -> Iterator[tuple[str, dict[str, Any]]]:
    from storage.ceph_rgw import ceph_rgw

    with ceph_rgw() as rgw:
        options = {"endpoint_url": rgw.url, "key": rgw.key_id, "secret": rgw.secret}
        fsspec.filesystem("s3", **options).mkdir("bench-b7")
        yield "s3://bench-b7", options


@contextmanager
def local_directory() -> Iterator[tuple[str, dict[str, Any]]]:
    with tempfile.TemporaryDirectory(prefix="dist-resume-b7-") as directory:
        yield directory, {}


def run(quick: bool) -> list[FigureResult]:
    from storage.ceph_rgw import missing_binaries

    items_per_shard = 500 if quick else 2000
    result = FigureResult("B7", f"items/s of a stream of {SHARDS} JSONL shards (higher is better)", "items/s")
    sources = {"local files": local_directory, "s3 (moto)": moto_bucket}
    if missing_binaries():
        result.notes.append(f"Ceph RGW not measured: {', '.join(missing_binaries())} not installed (tests/ceph_install.py).")
    else:
        sources["s3 (Ceph RGW)"] = ceph_bucket
    for source, place in sources.items():
        with ExitStack() as stack:
            root, options = stack.enter_context(place())
            urls = write_shards(root, items_per_shard, options)
            for workers in (0, 2):
                case = f"{source}, {workers} workers"
                made = loaders(urls, workers, options)
                runs = {name: (lambda loader=loader: items_per_second(loader, SHARDS * items_per_shard))
                        for name, loader in made.items()}
                stats = interleaved(runs, repetitions(quick, workers))
                for name, value in stats.items():
                    result.add(case, name, value)
                for name, target in ((OURS, TARGET), (OURS_SHUFFLED, None)):
                    ratio = stats[name].median / stats[TORCH].median
                    label = "vs torch" if name == OURS else "shuffled vs torch"
                    result.check(f"{case}: {label}", ratio, f">= {target}" if target else "(no target)",
                                 ratio >= target if target else None)
    result.notes += [
        f"{SHARDS} shards of {items_per_shard:,} JSON lines (~220 bytes each), read by JsonlReader, batch size "
        f"{BATCH_SIZE}, default collate; each epoch timed from iter() (worker start included) to the last batch, "
        "and checked to hold every item once.",
        "ShardedStream opens each canonical stream's next S3 shard while it reads the current one (local files: "
        "when reached), a shard shorter than 4 MiB fetched whole in one GET; the plain recipe opens each shard "
        "when it reaches it (fsspec.open: a HEAD, then a GET). ShardedStream counts the shards' "
        "lines once per loader (JsonlReader.count), in the dropped warm-up epoch. 'shuffle=True' adds the shard "
        "order and in-shard window shuffles (window 1024).",
        "JsonlReader declares draws_randomness = False, so ShardedStream reads it without seeding the global "
        "generators per block (G4 has nothing to fix); a reader without that declaration is seeded per block, "
        "about 30 us a batch at 0 workers.",
        "Both S3 servers run on 127.0.0.1: latency is far below a remote object store's, so prefetching gains "
        "little here. moto serves from this process, so at 0 workers its request handling, the prefetch thread "
        "and the reader share one GIL; Ceph RGW runs in processes of its own.",
    ]
    return [result]
