"""Tokenized documents as JSONL shards, the packed streams over them, and the checks that
a run's packed sequences hold every document's tokens once with the right boundaries
(importable by the gloo ranks of tests/packing_worker.py)."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy
import torch

from dist_resume import JsonlReader, ResumableDataLoader, ShardedStream
from dist_resume.packing import packed

# Documents per shard, of very different lengths: empty ones, one longer than a sequence
# of SEQ_LEN, an empty shard, a shard of a single short document.
DOCUMENT_LENGTHS = ((5, 0, 17, 3, 40, 1, 9), (), (2,), (33, 8, 8, 8, 0, 12), (7, 7, 7, 7, 7, 7, 7, 7), (25, 1, 30),
                    (50, 12, 12, 30, 5, 5, 5), (100,))
SEQ_LEN = 11


def token(shard: int, document: int, place: int) -> int:
    """The token at `place` of document `document` of shard `shard`: it says all three."""
    return (shard * 100 + document) * 1000 + place


def document_of(value: int) -> tuple[int, int]:
    return divmod(value // 1000, 100)


def write_documents(root: str, lengths: Sequence[Sequence[int]] = DOCUMENT_LENGTHS) -> list[str]:
    """One JSONL shard of documents ({"tokens": [...]}) per entry of `lengths`."""
    os.makedirs(root, exist_ok=True)
    urls = []
    for shard, documents in enumerate(lengths):
        url = os.path.join(root, f"docs-{shard:02d}.jsonl")
        with open(url, "w") as file:
            file.writelines(json.dumps({"tokens": [token(shard, d, j) for j in range(length)]}) + "\n"
                            for d, length in enumerate(documents))
        urls.append(url)
    return urls


def document_stream(urls: list[str], **options: Any) -> ShardedStream:
    return ShardedStream(urls, JsonlReader(), **{"window": 3, "seed": 5, **options})


def packed_stream(urls: list[str], mode: str = "concat", seq_len: int = SEQ_LEN, **options: Any) -> ShardedStream:
    return packed(document_stream(urls, **options), seq_len, mode=mode, field="tokens")


def collate_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch as plain lists, each sequence whole (what a rank writes down and the checks read)."""
    return [{"tokens": item["tokens"].tolist(), "position_ids": item["position_ids"].tolist(),
             "num_tokens": int(item["num_tokens"])} for item in items]


def packed_loader(stream: ShardedStream, **options: Any) -> ResumableDataLoader:
    return ResumableDataLoader(stream, collate_fn=collate_rows, **options)


def run_job(make: Callable[[int, int], ResumableDataLoader], world_size: int, state: dict[str, Any] | None,
            steps: int | None) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """Every rank of a job, one after another in this process: `make(rank, world_size)`
    builds its loader (batches of rows, `collate_rows`), which loads `state` and yields
    `steps` batches (None: to the epoch's end). Returns the global steps (the ranks' parts
    of each joined in rank order) and the merged state of every rank, as load_checkpoint
    hands it to the next job."""
    per_rank, merged = [], {}
    for rank in range(world_size):
        loader = make(rank, world_size)
        if state is not None:
            loader.load_state_dict(state)
        per_rank.append(list(itertools.islice(loader, steps)))
        merged.update(loader.state_dict())
    return [sum(parts, []) for parts in itertools.zip_longest(*per_rank, fillvalue=[])], merged


def pieces(sequence: dict[str, Any]) -> list[list[int]]:
    """A sequence's real tokens, cut where its position ids restart."""
    count = sequence["num_tokens"]
    real, positions = sequence["tokens"][:count], sequence["position_ids"][:count]
    cut = [i for i, position in enumerate(positions) if position == 0] + [count]
    return [real[a:b] for a, b in zip(cut, cut[1:])]


def check_documents(sequences: Iterable[dict[str, Any]], lengths: Sequence[Sequence[int]] = DOCUMENT_LENGTHS) -> None:
    """Every document's tokens are in `sequences` exactly once, each piece of a sequence is
    consecutive tokens of one document, and a piece starts wherever a document does."""
    seen: dict[tuple[int, int], list[int]] = {}
    for sequence in sequences:
        for piece in pieces(sequence):
            shard, document = document_of(piece[0])
            assert piece == list(range(piece[0], piece[0] + len(piece))), f"piece {piece} is not one document's run"
            seen.setdefault((shard, document), []).extend(value % 1000 for value in piece)
    for shard, documents in enumerate(lengths):
        for document, length in enumerate(documents):
            places = sorted(seen.pop((shard, document), []))
            assert places == list(range(length)), f"document {document} of shard {shard}: tokens {places}"
    assert not seen


def total_tokens(lengths: Sequence[Sequence[int]] = DOCUMENT_LENGTHS) -> int:
    return int(numpy.sum([sum(documents) for documents in lengths]))


def assert_same_batches(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Batches of `collate_packed` equal, step by step: every tensor, its dtype, max_seqlen."""
    assert len(got) == len(expected)
    for step, (batch, wanted) in enumerate(zip(got, expected)):
        assert batch.keys() == wanted.keys()
        for key, value in wanted.items():
            same = torch.equal(value, batch[key]) and value.dtype == batch[key].dtype \
                if isinstance(value, torch.Tensor) else value == batch[key]
            assert same, (step, key)
