"""Reproduction first (issue 34): what torchtitan-style buffer packing does across a
resume (benchmarks/torchtitan_style.py: a token buffer and a document count in the state), next
to `packed` streams over the same documents. At the same world size the buffer resumes
exactly; the state holds the token buffer (up to what is left of a whole document); at
another world size the saved counts mean other documents (each rank's split changed), so
loading them trains some documents twice and never trains others, or trains them in part.
torchtitan's own loader (ParallelAwareDataloader) refuses such a state with an assert on
every rank that existed before, and starts a rank that did not from its first document
with a warning. docs/language-models.md quotes these numbers."""

from __future__ import annotations

import itertools
import json
import pickle

from tests.packing_data import check_documents, packed_loader, packed_stream, run_job, token
from benchmarks.torchtitan_style import BufferPacker

SEQ_LEN = 15
SHARDS = 6
# 60 documents of 3 to 25 tokens; document d is document d // 6 of shard d % 6 (for `packed`)
DOCUMENTS = [[token(d % SHARDS, d // SHARDS, j) for j in range((d * 7) % 23 + 3)] for d in range(60)]


def split(part: int, parts: int) -> list[list[int]]:
    """Document `i` goes to slot `i % parts`, as `datasets.split_dataset_by_node` splits examples."""
    return DOCUMENTS[part::parts]


def trained(sequences) -> dict[str, list[int]]:
    """The documents none of whose tokens were trained, those trained in part, and those
    of which some token was trained twice or more."""
    seen: dict[int, int] = {}
    for sequence in sequences:
        for value in sequence:
            seen[value] = seen.get(value, 0) + 1
    times = [[seen.get(value, 0) for value in document] for document in DOCUMENTS]
    return {"never": [d for d, counts in enumerate(times) if max(counts) == 0],
            "in part": [d for d, counts in enumerate(times) if min(counts) == 0 < max(counts)],
            "twice": [d for d, counts in enumerate(times) if max(counts) >= 2]}


def run(world_size: int, states: list | None, steps: int | None) -> tuple[list[list[int]], list]:
    """Each rank's packer from its saved state (by rank index, as torchtitan keys states by
    dp rank), `steps` sequences each; the sequences and the ranks' states."""
    sequences, saved = [], []
    for rank in range(world_size):
        packer = BufferPacker(split, SEQ_LEN, rank, world_size)
        if states is not None and rank < len(states):
            packer.load_state_dict(states[rank])
        sequences += [sequence.tolist() for sequence in itertools.islice(packer, steps)]
        saved.append(packer.state_dict())
    return sequences, saved


def tokens_of(sequences) -> list[int]:
    return sorted(value for sequence in sequences for value in sequence)


def test_at_the_same_world_size_the_buffer_resumes_exactly():
    whole, _ = run(2, None, None)
    first, states = run(2, None, 5)
    rest, _ = run(2, states, None)
    assert sorted(map(tuple, first + rest)) == sorted(map(tuple, whole))


def test_the_state_holds_the_token_buffer_up_to_a_whole_document():
    # a state taken after a sequence holds what is left of the document being cut: here a
    # document of 100,000 tokens, seq_len 15, a state after one sequence
    packer = BufferPacker(lambda part, parts: [list(range(100_000))], SEQ_LEN)
    next(iter(packer))
    state = packer.state_dict()
    assert len(state["token_buffer"]) == 100_000 - (SEQ_LEN + 1)
    assert len(pickle.dumps(state)) > 2 * 100_000


def test_at_another_world_size_the_saved_buffers_train_documents_twice_and_lose_others():
    whole, _ = run(1, None, None)
    first, states = run(2, None, 5)
    rest, _ = run(3, states, None)  # rank 2 has no saved state: it starts from its first document
    assert [(state["sample_idx"], len(state["token_buffer"])) for state in states] == [(7, 5), (6, 6)]
    assert trained(first + rest) == {"never": [13, 15, 16, 18, 57], "in part": [54, 58, 59], "twice": [2, 5, 8, 11]}
    # 800 of the 840 tokens trained, against 832 without the resize (the end's partial buffer is dropped)
    assert (len(tokens_of(first + rest)), len(tokens_of(whole))) == (800, 832)


def test_packed_streams_over_the_same_documents_train_each_one_once_at_another_world_size(tmp_path):
    root = tmp_path / "documents"
    root.mkdir()
    urls = []
    for shard in range(SHARDS):  # the same 60 documents, 10 per shard
        url = root / f"docs-{shard}.jsonl"
        url.write_text("".join(json.dumps({"tokens": document}) + "\n" for document in DOCUMENTS[shard::SHARDS]))
        urls.append(str(url))

    def job(world_size, state, steps):
        global_steps, merged = run_job(lambda rank, size: packed_loader(
            packed_stream(urls, seq_len=SEQ_LEN, canonical_streams=6), batch_size=6 // size, rank=rank, world_size=size,
            even_batches=False), world_size, state, steps)
        return [row for step in global_steps for row in step], merged

    first, state = job(2, None, 5)
    rest, _ = job(3, state, None)
    values = [value for row in first + rest for value in row["tokens"][:row["num_tokens"]]]
    assert sorted(values) == sorted(value for document in DOCUMENTS for value in document)
    check_documents(first + rest, [[len(document) for document in DOCUMENTS[shard::SHARDS]] for shard in range(SHARDS)])
