"""Property tests of the packing arithmetic (dist_resume.packing): every token of every
document in exactly one sequence, in order, in both modes; the sequences' position ids
restart exactly where a document piece starts; "fit" cuts only documents longer than a
sequence; a shard's count is its number of sequences; token files cut as one shard of the
same documents is packed; the collated batch's targets, cu_seqlens and max_seqlen."""

from __future__ import annotations

import re

import numpy
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dist_resume.packing import PackedCollate, collate_packed
from dist_resume.packing.packer import Packer, count_sequences
from tests.packing_data import assert_same_batches

lengths_lists = st.lists(st.integers(0, 40), max_size=25)
seq_lens = st.integers(1, 16)
modes = st.booleans()  # fit


def documents(lengths: list[int]) -> list[numpy.ndarray]:
    """Document d holds the tokens d * 1000 + j: a token says its document and its place."""
    return [numpy.arange(length, dtype=numpy.int64) + d * 1000 for d, length in enumerate(lengths)]


def pack(lengths: list[int], seq_len: int, fit: bool, pad_id: int = -1) -> list[dict]:
    packer = Packer(seq_len + 1, fit, pad_id)
    sequences = [item for tokens in documents(lengths) for item in packer.add(tokens)]
    return sequences + list(packer.end())


def pieces(item: dict) -> list[list[int]]:
    """The real tokens of a sequence, cut where its position ids restart."""
    real = item["tokens"][:item["num_tokens"]].tolist()
    positions = item["position_ids"][:item["num_tokens"]].tolist()
    cut = [i for i, position in enumerate(positions) if position == 0] + [len(real)]
    return [real[a:b] for a, b in zip(cut, cut[1:])]


@given(lengths_lists, seq_lens, modes)
def test_every_token_is_in_exactly_one_sequence_in_order(lengths, seq_len, fit):
    sequences = pack(lengths, seq_len, fit)
    real = [token for item in sequences for token in item["tokens"][:item["num_tokens"]].tolist()]
    assert real == [token for tokens in documents(lengths) for token in tokens.tolist()]
    for item in sequences:
        assert item["tokens"].shape == item["position_ids"].shape == (seq_len + 1,)
        assert item["tokens"].dtype == item["position_ids"].dtype == numpy.int64
        assert 0 < item["num_tokens"] <= seq_len + 1
        assert (item["tokens"][item["num_tokens"]:] == -1).all()  # padding, at the end only


@given(lengths_lists, seq_lens, modes)
def test_position_ids_restart_exactly_at_each_document_piece(lengths, seq_len, fit):
    sequences = pack(lengths, seq_len, fit)
    for item in sequences:
        for piece in pieces(item):
            # one document's consecutive tokens: the ids say which document and where
            assert len({token // 1000 for token in piece}) == 1
            assert piece == list(range(piece[0], piece[0] + len(piece)))
        # where one piece ends and the next starts, the document changes (or the sequence starts)
        starts = [piece[0] for piece in pieces(item)]
        assert len({token // 1000 for token in starts}) == len(starts)
        padding = item["position_ids"][item["num_tokens"]:]
        assert padding.tolist() == list(range(len(padding)))  # one piece of its own
    # every document's first token starts a piece, and so does every sequence's
    firsts = {1000 * d for d, length in enumerate(lengths) if length}
    starting = {piece[0] for item in sequences for piece in pieces(item)}
    assert firsts <= starting
    assert all(item["position_ids"][0] == 0 for item in sequences)


@given(lengths_lists, seq_lens)
def test_concat_fills_every_sequence_but_the_last(lengths, seq_len):
    sequences = pack(lengths, seq_len, False)
    assert [item["num_tokens"] for item in sequences[:-1]] == [seq_len + 1] * (len(sequences) - 1)
    assert len(sequences) == -(-sum(lengths) // (seq_len + 1))


@given(lengths_lists, seq_lens)
def test_fit_cuts_only_documents_longer_than_a_sequence(lengths, seq_len):
    sequences = pack(lengths, seq_len, True)
    holding: dict[int, set[int]] = {}
    for number, item in enumerate(sequences):
        for piece in pieces(item):
            holding.setdefault(piece[0] // 1000, set()).add(number)
    for document, numbers in holding.items():
        if lengths[document] <= seq_len + 1:
            assert len(numbers) == 1, f"document {document} of {lengths[document]} tokens was cut"
        else:  # a long document is cut, into consecutive sequences, none skipped
            assert sorted(numbers) == list(range(min(numbers), max(numbers) + 1))
    # a sequence is padded only at the end of the shard, or when the next document did not fit
    for item, following in zip(sequences, sequences[1:]):
        if item["num_tokens"] < seq_len + 1:
            first = pieces(following)[0]
            assert item["num_tokens"] + lengths[first[0] // 1000] > seq_len + 1


@given(lengths_lists, seq_lens, modes)
def test_the_count_is_the_number_of_sequences(lengths, seq_len, fit):
    assert count_sequences(lengths, seq_len + 1, fit) == len(pack(lengths, seq_len, fit))


@given(st.lists(lengths_lists, min_size=1, max_size=4), seq_lens, modes, st.booleans())
def test_collated_batches_mask_padding_and_give_the_pieces_to_flash_attention(batches, seq_len, fit, mask_starts):
    items = [item for lengths in batches for item in pack(lengths, seq_len, fit)]
    if not items:
        return
    batch = PackedCollate(mask_document_starts=mask_starts)(items)
    width = seq_len + 1
    assert batch["tokens"].shape == (len(items), width)
    assert torch.equal(batch["inputs"], batch["tokens"][:, :-1])
    for row, item in enumerate(items):
        for j in range(seq_len):
            padding = j + 1 >= item["num_tokens"]
            starts = mask_starts and item["position_ids"][j + 1] == 0
            expected = -100 if padding or starts else int(item["tokens"][j + 1])
            assert int(batch["targets"][row, j]) == expected
    assert torch.equal(batch["position_ids"], torch.from_numpy(numpy.stack([item["position_ids"][:-1] for item in items])))
    flat = batch["position_ids"].reshape(-1).tolist()
    cu = batch["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == len(flat)
    lengths = torch.diff(cu).tolist()
    assert batch["max_seqlen"] == max(lengths)
    rebuilt = [position for length in lengths for position in range(length)]
    assert rebuilt == flat  # each piece of cu_seqlens counts its positions from 0


def test_a_small_batch_exactly():
    # documents of 3, 9 and 2 tokens, seq_len 4: sequences of 5 tokens, concatenated and cut
    batch = collate_packed(pack([3, 9, 2], 4, False))
    assert batch["tokens"].tolist() == [[0, 1, 2, 1000, 1001], [1002, 1003, 1004, 1005, 1006],
                                        [1007, 1008, 2000, 2001, -1]]
    assert batch["inputs"].tolist() == [[0, 1, 2, 1000], [1002, 1003, 1004, 1005], [1007, 1008, 2000, 2001]]
    assert batch["targets"].tolist() == [[1, 2, 1000, 1001], [1003, 1004, 1005, 1006], [1008, 2000, 2001, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 2, 3], [0, 1, 0, 1]]
    assert batch["cu_seqlens"].tolist() == [0, 3, 4, 8, 10, 12]
    assert batch["max_seqlen"] == 4
    assert batch["num_tokens"].tolist() == [5, 5, 4]
    # "fit": the second document does not fit after the first, so it starts a sequence
    fitted = collate_packed(pack([3, 5, 2], 4, True))
    assert fitted["tokens"].tolist() == [[0, 1, 2, -1, -1], [1000, 1001, 1002, 1003, 1004], [2000, 2001, -1, -1, -1]]
    assert fitted["num_tokens"].tolist() == [3, 5, 2]


def test_a_batch_collated_in_a_worker_arrives_equal_in_one_shared_buffer():
    # A batch leaves a worker through shared memory: built there as views of one buffer, it
    # is sent as one segment, and arrives equal to the batch collated in process.
    items = pack([3, 9, 2, 30, 1, 7], 4, False)
    in_process = collate_packed(items)
    (from_worker,) = list(torch.utils.data.DataLoader([items], batch_size=None, num_workers=1,
                                                      collate_fn=collate_packed))
    tensors = {key: value for key, value in from_worker.items() if isinstance(value, torch.Tensor)}
    assert tensors.keys() == {"tokens", "inputs", "targets", "position_ids", "cu_seqlens", "num_tokens"}
    assert {value.untyped_storage().data_ptr() for value in tensors.values()} == {
        from_worker["tokens"].untyped_storage().data_ptr()}
    assert all(value.is_shared() for value in tensors.values())
    assert_same_batches([from_worker], [in_process])


@given(st.lists(lengths_lists, min_size=1, max_size=4), seq_lens, modes, st.booleans(), st.data())
def test_parts_made_apart_join_into_the_batch_of_all_their_items(batches, seq_len, fit, mask_starts, data):
    # Workers that read some rows of a batch each make their part; the join is the batch.
    items = [item for lengths in batches for item in pack(lengths, seq_len, fit)]
    if not items:
        return
    collate = PackedCollate(mask_document_starts=mask_starts)
    owners = data.draw(st.lists(st.integers(0, 2), min_size=len(items), max_size=len(items)))
    parts = [[row for row, owner in enumerate(owners) if owner == part] for part in range(3)]
    joined = collate.join_parts([(rows, collate.collate_part([items[row] for row in rows])) for rows in parts if rows])
    assert_same_batches([joined], [collate(items)])


def test_parts_that_do_not_cover_a_batch_once_are_refused():
    items = pack([3, 9, 2], 4, False)
    parts = [([0, 1], collate_packed.collate_part(items[:2])), ([1], collate_packed.collate_part(items[1:2]))]
    with pytest.raises(ValueError, match=r"PackedCollate: the parts' rows \[\[0, 1\], \[1\]\] are not each row "
                                         r"of a batch of 3 once"):
        collate_packed.join_parts(parts)


def test_sequences_of_different_widths_in_one_batch_are_refused_however_they_are_collated():
    short, long = pack([10], 4, False), pack([14], 6, False)
    with pytest.raises(ValueError, match=re.escape("PackedCollate: one batch holds tokens of shapes [(5,), (7,)]; "
                                                   "every sequence of a batch has the same seq_len + 1 tokens")):
        collate_packed(short + long)
    parts = [(range(2), collate_packed.collate_part(short)), (range(2, 5), collate_packed.collate_part(long))]
    with pytest.raises(ValueError, match=re.escape("PackedCollate: one batch holds tokens of shapes [(5,), (7,)]; ")):
        collate_packed.join_parts(parts)


def test_sequences_whose_tokens_or_positions_are_not_integers_are_refused():
    items = pack([10], 4, False)
    floats = [{**item, "position_ids": item["position_ids"].astype(numpy.float64)} for item in items]
    message = "PackedCollate: a sequence's position_ids are float64, not integers"
    for collate in (collate_packed, collate_packed.collate_part):
        with pytest.raises(TypeError, match=re.escape(message)):
            collate(floats)
    with pytest.raises(TypeError, match=re.escape("PackedCollate: a sequence's tokens are float32, not integers")):
        collate_packed([{**item, "tokens": item["tokens"].astype(numpy.float32)} for item in items])


def test_uint64_token_ids_past_int64_are_refused_not_wrapped():
    """A batch is int64: an id of 2**63 or more would arrive negative. Ids below that go through."""
    items = pack([10], 4, False)
    fits = [{**item, "tokens": item["tokens"].astype(numpy.uint64)} for item in items]
    assert torch.equal(collate_packed(fits)["tokens"], collate_packed(items)["tokens"])
    past = [{**item, "tokens": item["tokens"].astype(numpy.uint64)} for item in items]
    past[1]["tokens"][2] = 2**63
    message = f"PackedCollate: a sequence's tokens hold {2**63}, past int64 (a batch is int64)"
    for collate in (collate_packed, collate_packed.collate_part):
        with pytest.raises(ValueError, match=re.escape(message)):
            collate(past)
