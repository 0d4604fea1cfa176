"""B8M: bytes a Mixture of ShardedStreams reads per epoch / the shards' bytes, by world size,
with canonical_streams C = 8 and global batch 48 (the B8 set-up): two aligned cases (every
source's share of a step a multiple of C, one with a map-style source) and two streams
weighted by their items (equal and uneven shards); each source is read about once.

Ranks are simulated one after another in this process (num_workers=0), as in B8: each reads
what its own batches need; within a rank each canonical stream of every source is read by
one worker whatever num_workers, so workers do not change the figure.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path


from dist_resume import Mixture, ResumableDataLoader, ShardedStream

from .b8_stream_reading import CANONICAL_STREAMS, GLOBAL_BATCH, WORLD_SIZES, CountingReader, write_shards
from .report import FigureResult
from .workloads import TinyDataset
from .timing import Stats


def read_ratio(sources: dict[str, tuple[list[str], list[int]]], world_size: int, mapped: int = 0) -> float:
    """Weights in proportion to the sources' items; `mapped`: the items of a map-style
    source mixed in (none if 0)."""
    reader = CountingReader()
    streams: dict = {name: ShardedStream(urls, reader, window=16, seed=3, lengths=sizes)
                     for name, (urls, sizes) in sources.items()}
    weights = {name: sum(sizes) for name, (_, sizes) in sources.items()}
    if mapped:
        streams["table"], weights["table"] = TinyDataset(mapped), mapped
    mixture = Mixture(streams, weights, canonical_streams=CANONICAL_STREAMS)
    for rank in range(world_size):
        loader = ResumableDataLoader(mixture, batch_size=GLOBAL_BATCH // world_size, rank=rank, world_size=world_size)
        for _ in loader:
            pass
    return reader.bytes / sum(Path(url).stat().st_size for urls, _ in sources.values() for url in urls)


def bound(world_size: int) -> float:
    """docs/stream-mixtures.md's bound on the bytes W ranks read / the bytes one rank reads,
    while every stream has items: 1 + 2W/C when W divides C, else 1 + 3W/C."""
    return 1 + (2 if CANONICAL_STREAMS % world_size == 0 else 3) * world_size / CANONICAL_STREAMS


def run(quick: bool) -> list[FigureResult]:
    reading = FigureResult("B8M", f"Mixture of 2 streams: bytes read per epoch / shard bytes, C={CANONICAL_STREAMS}, "
                                  f"G={GLOBAL_BATCH}", "ratio")
    shards = 16 if quick else 32
    rng = random.Random(0)
    cases = {  # (stream sources' shard sizes, map-style items); weights by items
        # 2:1 of equal shards: 32 and 16 items of every step, multiples of C
        "aligned": ({"a": [96] * shards, "b": [96] * (shards // 2)}, 0),
        # 4:1:1 with a map-style source: 32, 8 and 8 items of every step
        "aligned, map-style 1/6": ({"a": [96] * shards, "b": [48] * (shards // 2)}, 24 * shards),
        # a step's share of each canonical stream varies
        "by items": ({"equal": [96] * shards, "uneven": [rng.randint(40, 150) for _ in range(shards)]}, 0),
    }
    with tempfile.TemporaryDirectory() as directory:
        for case, (sizes, mapped) in cases.items():
            sources = {}
            for name, counts in sizes.items():
                root = Path(directory, f"case-{len(sources)}-{list(cases).index(case)}", name)
                root.mkdir(parents=True)
                sources[name] = (write_shards(root, counts), counts)
            alone = read_ratio(sources, 1, mapped)  # what the sources cost one rank
            for world_size in WORLD_SIZES:
                ratio = read_ratio(sources, world_size, mapped) if world_size > 1 else alone
                reading.add(f"{world_size} ranks", case, Stats.exact(ratio))
                if case.startswith("aligned") and CANONICAL_STREAMS % world_size == 0:
                    reading.check(f"{case}, {world_size} ranks", ratio, "== 1", abs(ratio - 1) < 1e-9)
                else:
                    reading.check(f"{case}, {world_size} ranks / 1 rank", ratio / alone,
                                  f"<= {bound(world_size):.3g}", ratio <= bound(world_size) * alone + 1e-9)
    reading.notes.append(
        f"{shards} shards per source (aligned: {shards} and {shards // 2} shards of 96 items, weights 2:1; with a "
        f"map-style source: {shards} shards of 96 items, {shards // 2} of 48 and {24 * shards} map-style items, 4:1:1; "
        "by items: 96 items each and 40..150 items (seeded)); weights in proportion to the sources' items, the epoch "
        "as long as all of them together. The bound is on the bytes W ranks read / the bytes 1 rank reads (a "
        "canonical stream that starts inside a shard reads that shard's prefix, whatever the world size: "
        "uneven shards cost one rank more than their bytes, as for a single stream, B8). With weights by items a "
        "step's share of each canonical stream varies by a few items, so rank boundaries fall inside streams and the "
        "ranks on both sides read the shard there.")
    return [reading]


if __name__ == "__main__":
    for figure in run(quick=True):
        print(figure.title)
        for world_size in WORLD_SIZES:
            values = ", ".join(f"{case}: {figure.value(f'{world_size} ranks', case).median:.3f}"
                               for case in ("aligned", "aligned, map-style 1/6", "by items"))
            print(f"  {world_size} ranks: {values} (bound on W ranks / 1 rank {bound(world_size):.3g})")
        for check in figure.checks:
            print(f"  {check.name}: {check.value:.3f} {check.target}: {'yes' if check.met else 'NO'}")
