"""Tokenized documents for the packing figures (B10): shards of length-prefixed uint16
documents, the reader both loaders read them with, and the same tokens as one token file."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy

from dist_resume import ShardedStream
from dist_resume.packing import TokenFile, packed

PREFIX = numpy.dtype("<u4")
TOKEN = numpy.dtype("<u2")
EOS = 0


def document_lengths(shards: int, documents: int, seed: int = 0) -> list[numpy.ndarray]:
    """Each shard's document lengths: log-normal around 700 tokens (a web corpus's shape),
    from 16 to 16,384."""
    generator = numpy.random.default_rng(seed)
    return [numpy.clip(generator.lognormal(6.5, 1.0, documents), 16, 16_384).astype(numpy.int64)
            for _ in range(shards)]


def write_shards(root: str, lengths: list[numpy.ndarray], vocabulary: tuple[int, int] = (1, 50_000)) -> list[str]:
    """One file per shard under `root` (made if missing): for each document its uint32
    length, then its uint16 tokens, drawn from `vocabulary` (the last one EOS)."""
    os.makedirs(root, exist_ok=True)
    urls, generator = [], numpy.random.default_rng(1)
    for shard, sizes in enumerate(lengths):
        url = os.path.join(root, f"documents-{shard:03}.bin")
        with open(url, "wb") as file:
            for size in sizes.tolist():
                tokens = generator.integers(*vocabulary, size, dtype=TOKEN)
                tokens[-1] = EOS
                file.write(numpy.array([size], PREFIX).tobytes() + tokens.tobytes())
        urls.append(url)
    return urls


@dataclass(frozen=True)
class LengthPrefixedDocuments:
    """Reads a shard of `write_shards`: each document as a list of ints (as a tokenizer
    hands them on), or, with `arrays`, as a numpy array."""

    arrays: bool = False
    draws_randomness = False

    def __call__(self, file: BinaryIO) -> Iterator[Any]:
        data = file.read()
        offset = 0
        while offset < len(data):
            (size,) = numpy.frombuffer(data, PREFIX, 1, offset)
            tokens = numpy.frombuffer(data, TOKEN, int(size), offset + PREFIX.itemsize)
            yield tokens if self.arrays else tokens.tolist()
            offset += PREFIX.itemsize + int(size) * TOKEN.itemsize


@dataclass(frozen=True)
class ShardDocuments:
    """`BufferPacker`'s documents: part `p` of `P` reads shards `p, p + P, ...`."""

    urls: tuple[str, ...]

    def __call__(self, part: int, parts: int) -> Iterator[list[int]]:
        reader = LengthPrefixedDocuments()
        for url in self.urls[part::parts]:
            with open(url, "rb") as file:
                yield from reader(file)


def packed_documents(urls: list[str], seq_len: int, mode: str = "concat", arrays: bool = False,
                     lengths: list[int] | None = None, **options: Any) -> ShardedStream:
    """The shards as a packed stream (unshuffled, as the plain recipe reads them; `lengths`:
    each shard's sequences, counted if None; `options`: the document stream's)."""
    documents = ShardedStream(urls, LengthPrefixedDocuments(arrays), **{"shuffle": False, **options})
    return packed(documents, seq_len, mode=mode, lengths=lengths)


def write_token_file(path: str, urls: list[str]) -> TokenFile:
    """The shards' tokens, documents in order, as one raw uint16 token file (EOS-ended documents)."""
    with open(path, "wb") as out:
        for url in urls:
            with open(url, "rb") as file:
                for document in LengthPrefixedDocuments(arrays=True)(file):
                    out.write(document.tobytes())
    return TokenFile(path, dtype="uint16", eos_id=EOS)
