"""Packed streams through ResumableDataLoader (dist_resume.packing.packed): the sequences
are those of a ShardedStream, so a resume anywhere continues the uninterrupted run's
batches (G1), a resume at other world sizes gives the same global batches (G3) with every
document's tokens once (G2), in both modes; the state is the stream's few integers whatever
seq_len (G5); in_order=False, skip and a plain DataLoader work; what cannot be packed or
resumed is refused with one clear error (G6)."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import numpy
import pytest
import torch
from torch.utils.data import DataLoader

from dist_resume import JsonlReader, ResumableDataLoader, ResumeStateError, ShardedStream
from dist_resume.packing import PackedDocuments, collate_packed, packed
from tests.packing_data import (SEQ_LEN, assert_same_batches, check_documents, collate_rows, document_stream,
                                packed_loader, packed_stream, run_job, write_documents)

MODES = ["concat", "fit"]


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_documents(str(tmp_path_factory.mktemp("documents")))


def sequences_of(batches) -> list[dict]:
    return [row for batch in batches for row in batch]


def job(urls, mode, world_size, state, steps):
    """A job's global steps (global batch 6) and merged state; canonical_streams 6, read by
    every world size alike (None would take the first job's slots)."""
    return run_job(lambda rank, size: packed_loader(packed_stream(urls, mode, canonical_streams=6), batch_size=6 // size,
                                                    rank=rank, world_size=size, even_batches=False),
                   world_size, state, steps)


@pytest.mark.parametrize("mode", MODES)
def test_resized_twice_the_global_batches_are_the_uninterrupted_ones_and_every_document_comes_once(urls, mode):
    whole, _ = job(urls, mode, 1, None, None)
    first, state = job(urls, mode, 2, None, 2)
    second, state = job(urls, mode, 3, state, 1)
    rest, _ = job(urls, mode, 1, state, None)
    assert first + second + rest == whole
    check_documents(sequence for step in whole for sequence in step)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_after_any_batch_continues_exactly(urls, mode, num_workers):
    def stream():
        return packed_stream(urls, mode, canonical_streams=2)

    whole = list(packed_loader(stream(), batch_size=2))
    for stop in (1, len(whole) // 2, len(whole) - 1):
        loader = packed_loader(stream(), batch_size=2, num_workers=num_workers)
        before = list(itertools.islice(loader, stop))
        resumed = packed_loader(stream(), batch_size=2, num_workers=num_workers)
        resumed.load_state_dict(loader.state_dict())
        assert before + list(resumed) == whole


@pytest.mark.parametrize("mode", MODES)
def test_collate_packed_batches_are_the_same_whoever_reads_and_collates_their_rows(urls, mode):
    # With workers, each collates the rows it read and the main process joins them: the
    # batches are the ones a single process collates, across a resume that changes workers.
    def loader(num_workers: int) -> ResumableDataLoader:
        return ResumableDataLoader(packed_stream(urls, mode, canonical_streams=4), batch_size=3,
                                   num_workers=num_workers, collate_fn=collate_packed)

    whole = list(loader(0))
    for num_workers in (2, 3):
        assert_same_batches(list(loader(num_workers)), whole)
    first = loader(2)
    before = list(itertools.islice(first, 3))
    resumed = loader(3)
    resumed.load_state_dict(first.state_dict())
    assert_same_batches(before + list(resumed), whole)


def test_the_sequences_are_the_documents_packed_shard_by_shard(urls):
    # seq_len 11: 12 tokens a sequence. Shard 0's documents (5, 0, 17, 3, 40, 1, 9) hold 75
    # tokens: 7 sequences concatenated and cut. "fit" cuts the 17 and the 40 (longer than a
    # sequence) but starts the 3 and the 9 in new sequences: 12, 10, 12, 12, 12, 8, 9 tokens.
    assert packed_stream(urls, "concat").lengths() == [7, 0, 1, 6, 5, 5, 10, 9]
    assert packed_stream(urls, "fit").lengths() == [7, 0, 1, 7, 8, 5, 11, 9]
    sequences = list(DataLoader(packed_stream(urls, "fit", shuffle=False, window=1), batch_size=7,
                                collate_fn=collate_rows))
    first = sequences[0]
    assert [row["num_tokens"] for row in first] == [12, 10, 12, 12, 12, 8, 9]
    assert first[0]["tokens"] == [0, 1, 2, 3, 4] + [2000 + j for j in range(7)]
    assert first[0]["position_ids"] == [0, 1, 2, 3, 4] + list(range(7))
    assert first[1]["tokens"] == [2007 + j for j in range(10)] + [0, 0]  # the rest of the 17, then padding
    assert first[1]["position_ids"] == list(range(10)) + [0, 1]
    assert first[2]["tokens"][:3] == [3000, 3001, 3002]
    check_documents(row for batch in sequences for row in batch)


@pytest.mark.parametrize("mode", MODES)
def test_in_order_false_hands_on_every_sequence_once_across_a_resume(urls, mode):
    def loader() -> ResumableDataLoader:
        return packed_loader(packed_stream(urls, mode), batch_size=2, num_workers=2, in_order=False,
                             even_batches=False)

    first = loader()
    before = sequences_of(itertools.islice(first, 4))
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    after = sequences_of(resumed)
    check_documents(before + after)


def test_skip_passes_over_whole_sequences_and_the_rest_is_the_uninterrupted_run(urls):
    whole = list(packed_loader(packed_stream(urls), batch_size=3))
    loader = packed_loader(packed_stream(urls), batch_size=3)
    taken = list(itertools.islice(loader, 2))
    loader.skip(3)
    assert taken + list(loader) == whole[:2] + whole[5:]


def test_a_plain_dataloader_reads_every_sequence_once(urls):
    stream = packed_stream(urls)
    stream.lengths()  # counted once, before the workers copy the stream
    check_documents(sequences_of(DataLoader(stream, batch_size=4, num_workers=2, collate_fn=collate_rows)))
    batch = next(iter(DataLoader(stream, batch_size=4, collate_fn=collate_packed)))
    assert batch["tokens"].shape == (4, SEQ_LEN + 1)


def test_the_state_is_a_few_integers_at_ten_thousand_shards_whatever_seq_len(tmp_path):
    shards = 10_000
    urls = []
    for shard in range(shards):
        url = tmp_path / f"s{shard}.jsonl"
        url.write_text(json.dumps({"tokens": [shard, shard, shard]}) + "\n")
        urls.append(str(url))
    sizes = {}
    for seq_len in (16, 65536):
        # every shard packs into one sequence (its one document of 3 tokens), whatever seq_len
        stream = packed(ShardedStream(urls, JsonlReader(), window=4), seq_len, field="tokens", lengths=[1] * shards)
        loader = packed_loader(stream, batch_size=4, rank=1, world_size=8)
        assert len(next(iter(loader))[0]["tokens"]) == seq_len + 1
        buffer = io.BytesIO()
        torch.save(loader.state_dict(), buffer)
        sizes[seq_len] = len(buffer.getvalue())
    assert sizes[16] == sizes[65536] <= 4096


# -- refusals -------------------------------------------------------------------------


@pytest.mark.parametrize("other", [{"seq_len": SEQ_LEN + 1}, {"mode": "fit"}])
def test_a_state_of_another_seq_len_or_mode_is_refused_naming_both(urls, other):
    loader = packed_loader(packed_stream(urls), batch_size=2)
    next(iter(loader))
    mode, seq_len = other.get("mode", "concat"), other.get("seq_len", SEQ_LEN)
    resumed = packed_loader(packed_stream(urls, mode, seq_len), batch_size=2)
    with pytest.raises(ResumeStateError) as error:
        resumed.load_state_dict(loader.state_dict())
    assert str(error.value).endswith(f"the state was saved packing seq_len={SEQ_LEN}, mode='concat'; this stream "
                                     f"packs seq_len={seq_len}, mode={mode!r}")


def test_a_state_of_another_document_reader_is_refused(urls):
    loader = packed_loader(packed_stream(urls), batch_size=2)
    next(iter(loader))
    other = packed(ShardedStream(urls, JsonlReader(encoding="latin-1"), window=3, seed=5), SEQ_LEN, field="tokens")
    resumed = packed_loader(other, batch_size=2)
    with pytest.raises(ResumeStateError, match=r"was saved with another reader \(digest \d+\); this ShardedStream's "
                                               r"reader has digest \d+$"):
        resumed.load_state_dict(loader.state_dict())


@pytest.mark.parametrize("document, what", [
    ([1.5, 2.0], "document 1 holds float64 values, not integer token ids"),
    ([[1, 2], [3, 4]], "document 1 is not a 1-D sequence of token ids: it has shape (2, 2)"),
    (["a", "b"], "document 1 holds <U1 values, not integer token ids"),
    ([True, False], "document 1 holds bool values, not integer token ids"),
    (7, "document 1 is not a 1-D sequence of token ids: it has shape ()"),
    ([2**64 - 1], "document 1 holds token id 18446744073709551615, past int64"),
    ([2**70], "document 1 holds object values, not integer token ids"),
])
def test_a_document_that_is_not_1d_integers_is_refused_naming_it_and_its_shard(tmp_path, document, what):
    shard = tmp_path / "bad.jsonl"
    shard.write_text(json.dumps({"tokens": [1, 2, 3]}) + "\n" + json.dumps({"tokens": document}) + "\n")
    stream = packed(ShardedStream([str(shard)], JsonlReader()), 4, field="tokens", lengths=[1])
    with pytest.raises(ValueError) as error:
        list(packed_loader(stream, batch_size=1))
    assert str(error.value) == what
    assert error.value.__notes__ == [f"while reading shard {shard}"]
    with pytest.raises(ValueError) as error:  # the count reads them too
        packed(ShardedStream([str(shard)], JsonlReader()), 4, field="tokens").lengths()
    assert str(error.value) == what


def test_a_document_without_the_field_is_refused(tmp_path):
    shard = tmp_path / "bad.jsonl"
    shard.write_text(json.dumps({"ids": [1, 2, 3]}) + "\n")
    with pytest.raises(ValueError) as error:
        packed(ShardedStream([str(shard)], JsonlReader()), 4, field="tokens").lengths()
    assert str(error.value) == "document 0 has no field 'tokens' (it is a dict)"


def test_what_packed_cannot_pack_is_refused(urls):
    with pytest.raises(TypeError, match="^packed\\(\\) takes a ShardedStream of tokenized documents, got list"):
        packed([1, 2], 8)
    with pytest.raises(ValueError, match="^packed\\(\\) takes a ShardedStream without transform"):
        packed(document_stream(urls, transform=lambda item: item), 8)
    with pytest.raises(ValueError, match=r"^seq_len must be in \[1, 268435456\), got 0$"):
        packed(document_stream(urls), 0)
    with pytest.raises(ValueError, match="^packing mode must be one of 'concat', 'fit', got 'greedy'$"):
        packed(document_stream(urls), 8, mode="greedy")
    with pytest.raises(TypeError, match="^documents must be a reader of documents"):
        PackedDocuments(None, 8)


def test_the_packed_stream_keeps_the_document_streams_settings(urls):
    documents = document_stream(urls, canonical_streams=4, storage_options={"anon": True})
    stream = packed(documents, 8, window=2)
    assert (stream.shards, stream.shuffle, stream.seed, stream.canonical_streams, stream.window) == \
        (urls, True, 5, 4, 2)
    assert dict(stream.storage_options) == {"anon": True}
    assert Path(stream.shards[0]).exists()


def test_documents_as_lists_numpy_arrays_or_tensors_pack_alike(tmp_path):
    shard = tmp_path / "docs.jsonl"
    shard.write_text("".join(json.dumps({"tokens": list(range(d * 100, d * 100 + n))}) + "\n"
                             for d, n in enumerate([5, 30, 0, 12])))

    def as_kind(convert):
        def documents(file):
            return (convert(row["tokens"]) for row in JsonlReader()(file))
        return documents

    kinds = {"list": list, "uint16": lambda ids: numpy.array(ids, dtype=numpy.uint16),
             "tensor": lambda ids: torch.tensor(ids, dtype=torch.int32)}
    packed_by_kind = {name: list(DataLoader(packed(ShardedStream([str(shard)], as_kind(convert), shuffle=False), 7),
                                            batch_size=None, collate_fn=lambda item: collate_rows([item])[0]))
                      for name, convert in kinds.items()}
    assert packed_by_kind["list"] == packed_by_kind["uint16"] == packed_by_kind["tensor"]
    assert [row["num_tokens"] for row in packed_by_kind["list"]] == [8, 8, 8, 8, 8, 7]
