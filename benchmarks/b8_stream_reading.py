"""B8: bytes a ShardedStream epoch reads / the shards' bytes, by world size, with
canonical_streams C = 8; the bytes of one rank's stream state at 10 and 10,000 shards; the
time and memory of an elastic load of 4,096 saved ranks' stream states.

Every item is one JSONL line of the same length, so bytes read = lines the reader yields x
line length. Ranks are simulated one after another in this process (num_workers=0): each
rank reads what its own batches need, as a real rank does; within a rank each canonical
stream is read by one worker whatever num_workers (tests/test_canonical_properties.py), so
workers do not change the figure.
"""

from __future__ import annotations

import copy
import json
import random
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from dist_resume import ResumableDataLoader, ShardedStream, WebDatasetReader
from dist_resume.state.fields import FIELDS
from dist_resume.streams.formats.tar_members import READ_BYTES
from dist_resume.streams.sharded import stream_spans

from .b3_state_size import serialized_bytes, tensor_bytes
from .report import FigureResult
from .timing import Stats
from .workloads import write_webdataset_shards

CANONICAL_STREAMS = 8
GLOBAL_BATCH = 48  # a multiple of C: every world size below divides it
WORLD_SIZES = (1, 2, 3, 4, 6, 8)
WINDOW = 16
ODD_GLOBAL_BATCH = 36  # not a multiple of C
RANK_FIELD = FIELDS.index("rank")


class CountingReader:
    """JSONL reader that counts the bytes it reads (ranks run in this process)."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, file: Any):
        for line in file:
            self.bytes += len(line)
            yield json.loads(line)["id"]


class CountingTarReader:
    """WebDatasetReader that counts the bytes it reads from its shards (ranks run in this process)."""

    draws_randomness = False

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, file: Any):
        return WebDatasetReader()(CountedFile(file, self))


class CountedFile:
    """A shard file whose reads add their bytes to `reader.bytes`."""

    def __init__(self, file: Any, reader: CountingTarReader) -> None:
        self.file, self.reader = file, reader

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.reader.bytes += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)


def write_shards(root: Path, sizes: list[int]) -> list[str]:
    urls = []
    for shard, size in enumerate(sizes):
        path = root / f"shard-{shard:03d}.jsonl"
        ids = [shard * 10_000 + i for i in range(size)]  # every line LINE_BYTES long
        path.write_text("".join(f'{{"id":{id_},"text":"{"x" * (40 - len(str(id_)))}"}}\n' for id_ in ids))
        urls.append(str(path))
    return urls


def read_ratio(urls: list[str], sizes: list[int], world_size: int, global_batch: int = GLOBAL_BATCH,
               reader: Any = None) -> float:
    reader = reader or CountingReader()
    stream = ShardedStream(urls, reader, window=WINDOW, seed=3, canonical_streams=CANONICAL_STREAMS, lengths=sizes)
    for rank in range(world_size):
        loader = ResumableDataLoader(stream, batch_size=global_batch // world_size, rank=rank, world_size=world_size)
        for _ in loader:
            pass
    return reader.bytes / sum(Path(url).stat().st_size for url in urls)


def bound(sizes: list[int], world_size: int) -> float:  # items, all of one length
    """ShardedStream's documented bound on bytes read / shard bytes (here C | G): each stream
    read by one rank, by two for N - 1 streams when N does not divide C; each reader reads
    its stream, the prefix of a shard cut at the stream's start, up to a window past its end,
    and for the padding that prefix and a window again."""
    total = sum(sizes)
    body = 1.0 if CANONICAL_STREAMS % world_size == 0 else 1 + (world_size - 1) / CANONICAL_STREAMS
    order = ShardedStream(["-"] * len(sizes), CountingReader(), seed=3, lengths=sizes).shard_order(0)
    firsts = [stream_spans(order, sizes, CANONICAL_STREAMS, c)[0] for c in range(1, CANONICAL_STREAMS)]
    cuts = sum(first for _, first, _ in firsts)  # items of cut shards before the stream's run
    padding = -total % GLOBAL_BATCH
    windows = CANONICAL_STREAMS * WINDOW * (2 if padding else 1)  # each reader's last block, and the padding's
    return body * (1 + (2 * cuts + windows) / total)


def tar_bound(sizes: list[int], world_size: int, shard_bytes: int) -> float:
    """`bound` for tar shards of `shard_bytes` in all: each reader that stops inside a shard
    may have read one block of WebDatasetReader's past what it needed."""
    body = 1.0 if CANONICAL_STREAMS % world_size == 0 else 1 + (world_size - 1) / CANONICAL_STREAMS
    blocks = CANONICAL_STREAMS * (2 if -sum(sizes) % GLOBAL_BATCH else 1)
    return bound(sizes, world_size) + body * blocks * READ_BYTES / shard_bytes


def run(quick: bool) -> list[FigureResult]:
    reading = FigureResult("B8", f"bytes read per epoch / shard bytes, C={CANONICAL_STREAMS}, G={GLOBAL_BATCH}",
                           "ratio")
    shards = 32 if quick else 64
    equal = [96] * shards  # 8 streams of equal length, a multiple of G: no tail, no padding
    rng = random.Random(0)
    uneven = [rng.randint(40, 150) for _ in range(shards)]
    with tempfile.TemporaryDirectory() as directory:
        for name, sizes in (("equal shards", equal), ("uneven shards", uneven)):
            root = Path(directory, name.replace(" ", "-"))
            root.mkdir()
            urls = write_shards(root, sizes)
            for world_size in WORLD_SIZES:
                ratio = read_ratio(urls, sizes, world_size)
                reading.add(f"{world_size} ranks", name, Stats.exact(ratio))
                limit = bound(sizes, world_size)
                reading.check(f"{name}, {world_size} ranks", ratio, f"<= {limit:.3g}", ratio <= limit + 1e-9)
                if name == "equal shards" and CANONICAL_STREAMS % world_size == 0:
                    reading.check(f"equal shards, {world_size} ranks (divides C)", ratio, "== 1.00", ratio == 1.0)
            if name == "equal shards":  # a global batch that C does not divide: no bound stated
                for world_size in (1, 2, 4):
                    ratio = read_ratio(urls, sizes, world_size, ODD_GLOBAL_BATCH)
                    reading.add(f"{world_size} ranks", f"equal shards, G={ODD_GLOBAL_BATCH}", Stats.exact(ratio))
            tar_urls = write_webdataset_shards(str(root), sizes)  # beside the JSONL shards
            for world_size in WORLD_SIZES:
                ratio = read_ratio(tar_urls, sizes, world_size, reader=CountingTarReader())
                reading.add(f"{world_size} ranks", f"tar, {name}", Stats.exact(ratio))
                limit = tar_bound(sizes, world_size, sum(Path(url).stat().st_size for url in tar_urls))
                reading.check(f"tar, {name}, {world_size} ranks", ratio, f"<= {limit:.3g}", ratio <= limit + 1e-9)
                if name == "equal shards" and CANONICAL_STREAMS % world_size == 0:
                    reading.check(f"tar, equal shards, {world_size} ranks (divides C)", ratio, "== 1.00", ratio == 1.0)
    reading.notes += [
        f"{shards} shards; equal: {equal[0]} items each (no shard is cut between two streams, no padding); uneven: "
        "40..150 items (seeded): 7 shards cut between streams, whose prefixes the second stream reads past, and a "
        "padded final step. One item = one JSONL line of the same length. 1, 2, 4 and 8 ranks divide C.",
        "tar: the same items as WebDataset tar shards (an int64 and 256 bytes a record, written by webdataset's "
        f"TarWriter), read by WebDatasetReader in blocks of {READ_BYTES // 1024} KiB: a reader that stops inside a "
        "shard has read up to one block past its last record, which its bound adds (a block per canonical stream, "
        "two with padding).",
    ]
    state = FigureResult("B8-state", "one rank's loader state over a ShardedStream, by shard count", "bytes",
                         log_scale=True)
    for shards_count in (10, 10_000):
        stream = ShardedStream([f"shard-{i}.jsonl" for i in range(shards_count)], CountingReader(),
                               lengths=[100] * shards_count)
        entry = ResumableDataLoader(stream, batch_size=4, rank=1, world_size=8).state_dict()
        case = f"{shards_count} shards"
        state.add(case, "torch.save", Stats.exact(serialized_bytes(entry)))
        state.add(case, "tensor bytes", Stats.exact(tensor_bytes(entry)))
    largest = state.value("10000 shards", "torch.save").median
    state.check("torch.save bytes at 10,000 shards", largest, "<= 4096", largest <= 4096)
    growth = largest - state.value("10 shards", "torch.save").median
    state.check("growth from 10 to 10,000 shards", growth, "== 0", growth == 0)
    state.notes.append("The per-shard format this replaces held 160,168 bytes per rank at 10,000 shards (issue 21).")
    return [reading, state, elastic_load()]


def elastic_load(saved_ranks: int = 4096) -> FigureResult:
    """One rank of 2048 loads the stream states of 4096 saved ranks (10,000 shards)."""
    result = FigureResult("B8-load", f"elastic load of {saved_ranks} saved ranks' ShardedStream states, 10,000 shards",
                          "s")
    stream = ShardedStream([f"shard-{i}.jsonl" for i in range(10_000)], CountingReader(), lengths=[100] * 10_000,
                           canonical_streams=saved_ranks)
    one = ResumableDataLoader(stream, batch_size=2, rank=0, world_size=saved_ranks).state_dict()
    state = {key: value for key, value in one.items() if not key.startswith("rank_")}
    for rank in range(saved_ranks):  # every rank's entry, as a save of that many ranks holds them
        entry = copy.deepcopy(one["rank_0"])
        entry["progress"][RANK_FIELD] = rank
        state[f"rank_{rank}"] = entry
    times = []
    for _ in range(3):
        loader = ResumableDataLoader(stream, batch_size=4, rank=1, world_size=saved_ranks // 2)
        began = time.perf_counter()
        loader.load_state_dict(state)
        times.append(time.perf_counter() - began)
    result.add(f"{saved_ranks} -> {saved_ranks // 2} ranks", "load_state_dict", Stats.of(times))
    tracemalloc.start()
    ResumableDataLoader(stream, batch_size=4, rank=1, world_size=saved_ranks // 2).load_state_dict(state)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    result.notes.append(f"peak Python memory of one load (tracemalloc): {peak / 2**20:.1f} MiB")
    result.check(f"{saved_ranks} -> {saved_ranks // 2} ranks, seconds", min(times), "< 1", min(times) < 1)
    return result
