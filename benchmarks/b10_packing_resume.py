"""B10R: time from a load to the first batch at 10% and 90% of an epoch (a packed
ShardedStream, TokenSequences, and the torchtitan-style buffer packer, which passes over the
documents it read by reading them again); B10S: bytes of one rank's loader state after a
batch, at 10 and 10,000 shards and seq_len 512 and 8192, against the torchtitan-style
state (its document count and token buffer)."""

from __future__ import annotations

import itertools
import os
import pickle
import tempfile

import numpy
from torch.utils.data import DataLoader

from dist_resume import ResumableDataLoader
from dist_resume.packing import TokenSequences, collate_packed

from .b3_state_size import serialized_bytes
from .packing_workloads import ShardDocuments, document_lengths, packed_documents, write_shards, write_token_file
from .report import FigureResult
from .timing import Stats, interleaved, seconds
from .torchtitan_style import BufferPacker

SEQ_LEN = 2048
BATCH_SIZE = 8
PLACES = (0.0, 0.1, 0.9)
STREAM, FILES, TITAN = "packed ShardedStream", "TokenSequences", "torchtitan-style buffer packing"


def first_batch_seconds(make, state) -> float:
    """From building the loader and loading `state` to its first batch."""
    def first() -> None:
        loader = make()
        if state is not None:
            loader.load_state_dict(state)
        next(iter(loader))
    return seconds(first)


def run(quick: bool) -> list[FigureResult]:
    return [_first_batch(quick), _state_bytes(quick)]


def _first_batch(quick: bool) -> FigureResult:
    shards, documents = (8, 150) if quick else (32, 600)
    lengths = document_lengths(shards, documents)
    result = FigureResult("B10R", f"from a load to the first batch, seq_len {SEQ_LEN}, 0 workers (lower is better)",
                          "s")
    with tempfile.TemporaryDirectory(prefix="dist-resume-b10r-") as root:
        urls = write_shards(root, lengths)
        counts = packed_documents(urls, SEQ_LEN).lengths()
        token_file = write_token_file(os.path.join(root, "tokens.bin"), urls)
        makers = {
            STREAM: lambda: ResumableDataLoader(packed_documents(urls, SEQ_LEN, lengths=counts),
                                                batch_size=BATCH_SIZE, collate_fn=collate_packed),
            FILES: lambda: ResumableDataLoader(TokenSequences([token_file], SEQ_LEN), batch_size=BATCH_SIZE,
                                               shuffle=True, collate_fn=collate_packed),
        }
        cases = {}
        for place in PLACES:
            for name, make in makers.items():
                loader = make()
                loader.skip(int(place * len(loader)))  # the state of a run that stopped there
                cases[(place, name)] = (make, loader.state_dict() if place else None)
            read = int(place * sum(map(len, lengths)))  # documents the buffer packer had read
            cases[(place, TITAN)] = (lambda: _TitanLoader(urls), {"sample_idx": read, "token_buffer": []})
        largest = max(range(shards), key=lambda shard: counts[shard])
        cases[("one shard", STREAM)] = (lambda: _OneShard(urls[largest]), None)
        stats = interleaved({key: (lambda key=key: first_batch_seconds(*cases[key])) for key in cases},
                            3 if quick else 7)
        for (place, name), value in stats.items():
            result.add(place if isinstance(place, str) else f"{place:.0%} of the epoch", name, value)
        # issue 34's goal for the stream: the same wherever it resumes, at most one shard read again
        extra = max(stats[(place, STREAM)].median for place in PLACES[1:]) - stats[(0.0, STREAM)].median
        shard = stats[("one shard", STREAM)].median
        result.check("packed ShardedStream: slowest resume - fresh start, in shards read", extra / shard, "<= 1.5",
                     extra <= 1.5 * shard)
        for name in (STREAM, FILES, TITAN):
            ratio = stats[(0.9, name)].median / stats[(0.1, name)].median
            result.check(f"{name}: 90% / 10%", ratio, "(no target)", None)
    result.notes += [
        f"{shards} shards of {documents} documents (as in B10). Each case builds its loader, loads the state of a run "
        "stopped at that place of the epoch and takes one batch. ResumableDataLoader's states come from skip() (the "
        "same state a run that trained there saves); the packed stream is given its shards' sequence counts "
        "(lengths=): without them the first load counts every shard once (one pass over the data, per job).",
        "A packed stream resumes by reopening the shard that each canonical stream stands in and reading it from its "
        "start to the resume position (one canonical stream here: at most one shard); TokenSequences computes "
        "positions. The buffer packer's state is the count of documents read: it reads them again to pass them. "
        "'one shard': reading and packing the largest shard whole, the most a packed stream's resume reads again "
        "(per canonical stream); where in its shard the resume position falls decides how much of it is read.",
    ]
    return result


class _OneShard:
    """Reading and packing one whole shard, as a loader that `first_batch_seconds` times."""

    def __init__(self, url: str) -> None:
        self.reader, self.reader_url = packed_documents([url], SEQ_LEN, lengths=[0]).reader, url

    def __iter__(self):
        with open(self.reader_url, "rb") as file:
            yield sum(1 for _ in self.reader(file))


class _TitanLoader:
    """The buffer packer in a DataLoader, with the packer's state as the loader's."""

    def __init__(self, urls: list[str]) -> None:
        self.packer = BufferPacker(ShardDocuments(tuple(urls)), SEQ_LEN)
        self.loader = DataLoader(self.packer, batch_size=BATCH_SIZE)

    def load_state_dict(self, state: dict) -> None:
        self.packer.load_state_dict(state)

    def __iter__(self):
        return iter(self.loader)


def _state_bytes(quick: bool) -> FigureResult:
    result = FigureResult("B10S", "loader state of one rank after one batch (torch.save)", "bytes", log_scale=True)
    with tempfile.TemporaryDirectory(prefix="dist-resume-b10s-") as root:
        for shards in (10, 10_000):
            urls = write_shards(root, [numpy.array([100])] * shards)  # one document, one sequence a shard
            for seq_len in (512, 8192):
                loader = ResumableDataLoader(packed_documents(urls, seq_len, lengths=[1] * shards), batch_size=4,
                                             rank=1, world_size=8, collate_fn=collate_packed)
                next(iter(loader))
                result.add(f"{shards:,} shards", f"packed stream, seq_len {seq_len}",
                           Stats.exact(serialized_bytes(loader.state_dict())))
        urls = write_shards(root, document_lengths(4, 200))
        for seq_len in (512, 8192):
            sizes = []
            for stop in range(1, 41):  # states after 1 .. 40 sequences: the buffer left each time
                packer = BufferPacker(ShardDocuments(tuple(urls)), seq_len)
                for _ in itertools.islice(packer, stop):
                    pass
                sizes.append(serialized_bytes({"loader": pickle.dumps(packer.state_dict())}))
            result.add("torchtitan-style, 40 stops", f"seq_len {seq_len}, median", Stats.of(sizes))
    largest = max(row.stats.median for row in result.rows if row.series.startswith("packed"))
    result.check("packed stream, largest", largest, "<= 4096", largest <= 4096)
    result.notes += [
        "The packed stream's state is a ShardedStream's: the epoch position and a few integers, whatever the number "
        "of shards or seq_len (each shard here holds one document, so every shard is one sequence).",
        "The torchtitan-style state pickles its document count and token buffer (as torchtitan's loader pickles "
        "its dataset's state) and torch.save stores that: its size is the leftover tokens of the document being "
        "cut, up to a whole document (16,384 tokens at most here).",
    ]
    return result
