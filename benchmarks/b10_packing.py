"""B10: tokens/s of packed sequences. A packed ShardedStream through ResumableDataLoader vs
torch's DataLoader over a torchtitan-style IterableDataset (a token buffer per worker) that
packs the same shards, read by the same document reader; and TokenSequences over one token
file through ResumableDataLoader vs a DataLoader over plain slices of the memory-mapped
file. Side by side in one run, at 0 and 2 workers."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import numpy
import torch
from torch.utils.data import DataLoader, Dataset

from dist_resume import ResumableDataLoader
from dist_resume.packing import TokenSequences, collate_packed

from .packing_workloads import ShardDocuments, document_lengths, packed_documents, write_shards, write_token_file
from .report import FigureResult
from .timing import interleaved, repetitions, seconds
from .torchtitan_style import BufferPacker

SEQ_LEN = 2048
BATCH_SIZE = 8
OURS, TITAN = "ResumableDataLoader + packed ShardedStream", "DataLoader + torchtitan-style buffer packing"
FILE_OURS, FILE_PLAIN = "ResumableDataLoader + TokenSequences", "DataLoader + memmap slices"
TARGET = 1.0  # issue 34: >= 1.0x the torchtitan-style loader's tokens/s


class MemmapSlices(Dataset):
    """Sequence `i` of a raw token file, sliced from its memory map (nanoGPT's way), no
    document boundaries; the map is opened in each process that reads it."""

    def __init__(self, path: str, dtype: str, width: int) -> None:
        self.path, self.dtype, self.width = path, dtype, width
        self.tokens = os.path.getsize(path) // numpy.dtype(dtype).itemsize
        self._map: Any = None

    def __len__(self) -> int:
        return -(-self.tokens // self.width)

    def __getitem__(self, index: int) -> torch.Tensor:
        if self._map is None:
            self._map = numpy.memmap(self.path, self.dtype, mode="r")
        sequence = numpy.zeros(self.width, dtype=numpy.int64)
        part = self._map[index * self.width:(index + 1) * self.width]
        sequence[:len(part)] = part
        return torch.from_numpy(sequence)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_map": None}


def real_tokens(batch: Any) -> int:
    """Tokens of a batch that are not padding."""
    return int(batch["num_tokens"].sum()) if isinstance(batch, dict) else batch.numel()


def tokens_per_second(make: Callable[[], Any], low: int, high: int) -> float:
    """Real tokens per second of one epoch of the loader `make()` builds (built untimed)."""
    loader = make()
    counted: list[int] = []
    elapsed = seconds(lambda: counted.append(sum(real_tokens(batch) for batch in loader)))
    assert low <= counted[0] <= high, (counted, low, high)  # the loaders read the same tokens
    return counted[0] / elapsed


def run(quick: bool) -> list[FigureResult]:
    shards, documents = (8, 150) if quick else (16, 600)
    lengths = document_lengths(shards, documents)
    total = int(sum(int(sizes.sum()) for sizes in lengths))
    width = SEQ_LEN + 1
    result = FigureResult("B10", f"tokens/s of packed sequences, seq_len {SEQ_LEN} (higher is better)", "tokens/s")
    with tempfile.TemporaryDirectory(prefix="dist-resume-b10-") as root:
        urls = write_shards(root, lengths)
        counts = packed_documents(urls, SEQ_LEN).lengths()
        token_file = write_token_file(os.path.join(root, "tokens.bin"), urls)
        for workers in (0, 2):
            case = f"{workers} workers"
            # the buffer packer drops each worker's last, partial sequence
            titan_low = total - max(workers, 1) * width
            made = {  # each epoch on a new loader: the buffer packer keeps its place in itself
                OURS: (lambda: ResumableDataLoader(packed_documents(urls, SEQ_LEN, lengths=counts),
                                                   batch_size=BATCH_SIZE, num_workers=workers,
                                                   collate_fn=collate_packed, even_batches=False), total, total),
                TITAN: (lambda: DataLoader(BufferPacker(ShardDocuments(tuple(urls)), SEQ_LEN), batch_size=BATCH_SIZE,
                                           num_workers=workers), titan_low, total),
                FILE_OURS: (lambda: ResumableDataLoader(TokenSequences([token_file], SEQ_LEN), batch_size=BATCH_SIZE,
                                                        shuffle=True, num_workers=workers, collate_fn=collate_packed,
                                                        even_batches=False), total, total),
                FILE_PLAIN: (lambda: DataLoader(MemmapSlices(token_file.path, "uint16", width), batch_size=BATCH_SIZE,
                                                shuffle=True, num_workers=workers), total, total + width),
            }
            runs = {name: (lambda made=made, name=name: tokens_per_second(*made[name])) for name in made}
            stats = interleaved(runs, repetitions(quick, workers))
            for name, value in stats.items():
                result.add(case, name, value)
            ratio = stats[OURS].median / stats[TITAN].median
            result.check(f"{case}: packed stream vs torchtitan-style", ratio, f">= {TARGET}", ratio >= TARGET)
            ratio = stats[FILE_OURS].median / stats[FILE_PLAIN].median
            result.check(f"{case}: TokenSequences vs memmap slices", ratio, "(no target)", None)
    padded = sum(counts) * width - total
    result.notes += [
        f"{shards} shards of {documents} documents (log-normal lengths around 700 tokens, 16 to 16,384; {total:,} "
        f"tokens), stored as length-prefixed uint16 tokens and read by one reader yielding each document as a "
        f"list of ints (as a tokenizer hands them on); seq_len {SEQ_LEN}, batch size {BATCH_SIZE}; each epoch timed "
        "from iter() (worker start included) to the last batch, and checked to hold every token (the buffer packer "
        "drops each worker's last partial sequence; ResumableDataLoader runs with even_batches=False, so that no "
        "sequence repeats at the end). tokens/s counts real tokens, not padding.",
        f"The packed stream ('concat', unshuffled as the plain recipe reads, shard counts given with lengths=) pads "
        f"each shard's last sequence: {padded:,} padding token slots in {sum(counts):,} sequences "
        f"({padded / (sum(counts) * width):.2%}); its batches are collate_packed's (inputs, targets, position_ids, "
        "cu_seqlens). The torchtitan-style loader yields (tokens) with default collate, no document boundaries.",
        "TokenSequences: the same tokens in one raw uint16 file (documents ended by EOS), shuffled, each sequence's "
        "document starts found by scanning it for EOS, collate_packed; memmap slices: the same sequences sliced "
        "from the map, default collate, no boundaries.",
    ]
    return [result]
