"""Token files as a map-style dataset of packed sequences (dist_resume.packing.TokenSequences):
the sequences are the documents concatenated and cut, with position ids restarting at each
document start (from document offsets, an EOS id or Megatron-LM's index); the files are
memory-mapped in each worker (fork and spawn); exact and elastic resume, skip and
in_order=False as for any map-style dataset; a state of another seq_len or other files is
refused naming what differs, and so is every malformed file."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import numpy
import pytest

from dist_resume import ResumableDataLoader, ResumeStateError
from dist_resume.packing import TokenFile, TokenSequences
from dist_resume.packing.packer import Packer
from tests.packing_data import DOCUMENT_LENGTHS, check_documents, collate_rows, run_job
from tests.token_file_data import EOS, documents, write_megatron, write_npy, write_raw_with_eos

SEQ_LEN = 9


def packed_once(docs: list[list[int]], seq_len: int = SEQ_LEN) -> list[dict]:
    """The concat packing of `docs` as one shard (Packer): what the token files must give."""
    packer = Packer(seq_len + 1, False, 0)
    items = [item for doc in docs for item in packer.add(numpy.array(doc, dtype=numpy.int64))] + list(packer.end())
    return collate_rows(items)


def read_all(dataset) -> list[dict]:
    return collate_rows([dataset[i] for i in range(len(dataset))])


@pytest.fixture
def npy_files(tmp_path: Path) -> list[TokenFile]:
    files = []
    for shard, lengths in enumerate(DOCUMENT_LENGTHS):
        path, starts = write_npy(tmp_path / f"tokens-{shard}.npy", documents(shard, lengths))
        files.append(TokenFile(str(path), document_starts=str(starts)))
    return files


def test_the_files_are_their_documents_concatenated_and_cut(npy_files):
    dataset = TokenSequences(npy_files, SEQ_LEN)
    every = [doc for shard, lengths in enumerate(DOCUMENT_LENGTHS) for doc in documents(shard, lengths)]
    assert len(dataset) == -(-sum(map(len, every)) // (SEQ_LEN + 1))
    assert read_all(dataset) == packed_once(every)  # a file's start is a document start: the packer's too
    check_documents(read_all(dataset))


def test_negative_and_out_of_range_indices(npy_files):
    dataset = TokenSequences(npy_files, SEQ_LEN)
    assert collate_rows([dataset[-1]]) == collate_rows([dataset[len(dataset) - 1]])
    with pytest.raises(IndexError, match=f"^TokenSequences index {len(dataset)} is out of range for {len(dataset)} "
                                         "sequences$"):
        dataset[len(dataset)]


def test_an_eos_id_ends_each_document(tmp_path):
    docs = documents(0, [4, 12, 1, 30, 6])
    path = write_raw_with_eos(tmp_path / "tokens.bin", docs, "uint32")
    dataset = TokenSequences([TokenFile(str(path), dtype="uint32", eos_id=EOS)], SEQ_LEN)
    assert read_all(dataset) == packed_once([doc + [EOS] for doc in docs])


def test_uint16_tokens_as_nanogpt_keeps_them(tmp_path):
    docs = documents(0, [5, 25, 3])
    path = write_raw_with_eos(tmp_path / "train.bin", docs, "uint16")
    dataset = TokenSequences([TokenFile(str(path), dtype="uint16", eos_id=EOS)], SEQ_LEN)
    assert dataset[0]["tokens"].dtype == numpy.int64
    assert read_all(dataset) == packed_once([doc + [EOS] for doc in docs])


@pytest.mark.parametrize("dtype", [numpy.uint16, numpy.int32, numpy.int64])
def test_megatron_bin_and_idx(tmp_path, dtype):
    docs = documents(0, [7, 0, 19, 2, 11])
    prefix = write_megatron(tmp_path / "corpus_text_document", docs, dtype)
    dataset = TokenSequences([TokenFile.megatron(str(prefix))], SEQ_LEN)
    assert read_all(dataset) == packed_once(docs)


def test_without_boundaries_a_file_is_one_document(tmp_path):
    path = tmp_path / "tokens.npy"
    numpy.save(path, numpy.arange(25, dtype=numpy.int32))
    dataset = TokenSequences([str(path)], SEQ_LEN)
    assert [row["position_ids"] for row in read_all(dataset)] == [list(range(10)), list(range(10)),
                                                                  list(range(5)) + list(range(5))]
    assert [row["num_tokens"] for row in read_all(dataset)] == [10, 10, 5]


def test_the_dataset_pickles_without_its_tokens(tmp_path):
    path = tmp_path / "big.npy"
    numpy.save(path, numpy.arange(1_000_000, dtype=numpy.int64))
    dataset = TokenSequences([str(path)], 127)
    assert len(pickle.dumps(dataset)) < 2000
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy[5]["tokens"].tolist() == list(range(5 * 128, 6 * 128))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_map_the_files_themselves_and_a_resume_continues_exactly(npy_files, context):
    def loader(**options):
        return ResumableDataLoader(TokenSequences(npy_files, SEQ_LEN), batch_size=3, shuffle=True, seed=3,
                                   collate_fn=collate_rows, **options)

    whole = list(loader())
    workers = loader(num_workers=2, multiprocessing_context=context)
    before = list(itertools.islice(workers, 4))
    resumed = loader(num_workers=2, multiprocessing_context=context)
    resumed.load_state_dict(workers.state_dict())
    assert before + list(resumed) == whole
    check_documents(row for batch in whole for row in batch)


def test_a_resume_at_another_world_size_gives_every_sequence_once(npy_files):
    def job(world_size, state, steps):
        global_steps, merged = run_job(lambda rank, size: ResumableDataLoader(
            TokenSequences(npy_files, SEQ_LEN), batch_size=6 // size, rank=rank, world_size=size, shuffle=True,
            even_batches=False, collate_fn=collate_rows), world_size, state, steps)
        return [row for step in global_steps for row in step], merged

    first, state = job(2, None, 2)
    second, state = job(3, state, 1)
    rest, _ = job(1, state, None)
    check_documents(first + second + rest)


def test_skip_and_in_order_false(npy_files):
    def loader(**options):
        return ResumableDataLoader(TokenSequences(npy_files, SEQ_LEN), batch_size=2, collate_fn=collate_rows,
                                   **options)

    whole = list(loader())
    skipping = loader()
    taken = list(itertools.islice(skipping, 1))
    skipping.skip(2)
    assert taken + list(skipping) == whole[:1] + whole[3:]
    unordered = loader(num_workers=2, in_order=False)
    check_documents(row for batch in unordered for row in batch)


# -- refusals -------------------------------------------------------------------------


def test_a_state_of_another_seq_len_is_refused_even_at_the_same_length(tmp_path):
    path = tmp_path / "tokens.npy"
    numpy.save(path, numpy.arange(100, dtype=numpy.int64))
    # 100 tokens: 10 sequences of 10 tokens (seq_len 9) or of 11 (seq_len 10, the last one of 1)
    saved = ResumableDataLoader(TokenSequences([str(path)], 9), batch_size=2)
    next(iter(saved))
    loader = ResumableDataLoader(TokenSequences([str(path)], 10), batch_size=2)
    with pytest.raises(ResumeStateError) as error:
        loader.load_state_dict(saved.state_dict())
    assert str(error.value) == ("loader state was saved for token sequences of seq_len=9, pad_id=0; this "
                                "TokenSequences has seq_len=10, pad_id=0")


def test_a_state_of_other_files_is_refused(tmp_path):
    for name, size in (("a.npy", 100), ("b.npy", 101)):
        numpy.save(tmp_path / name, numpy.arange(size, dtype=numpy.int64))
    saved = ResumableDataLoader(TokenSequences([str(tmp_path / "a.npy")], 9), batch_size=2)
    next(iter(saved))
    loader = ResumableDataLoader(TokenSequences([str(tmp_path / "b.npy")], 9), batch_size=2)
    with pytest.raises(ResumeStateError) as error:
        loader.load_state_dict(saved.state_dict())
    assert str(error.value) == ("loader state was saved for token files of 100 tokens (1 files: 100); these files "
                                "hold 101 (1 files: 101)")


def test_a_plain_dataset_state_and_a_token_sequences_state_do_not_mix(tmp_path):
    numpy.save(tmp_path / "a.npy", numpy.arange(100, dtype=numpy.int64))
    tokens = ResumableDataLoader(TokenSequences([str(tmp_path / "a.npy")], 9), batch_size=2)
    plain = ResumableDataLoader(list(range(10)), batch_size=2)
    next(iter(plain))
    with pytest.raises(ResumeStateError) as error:
        tokens.load_state_dict(plain.state_dict())
    assert str(error.value) == "loader state was saved for another dataset; this loader's dataset is TokenSequences"
    next(iter(tokens))
    with pytest.raises(ResumeStateError, match="^loader state was saved for a dataset with definition digest"):
        plain.load_state_dict(tokens.state_dict())


def test_malformed_token_files_are_refused_naming_them(tmp_path):
    numpy.save(tmp_path / "matrix.npy", numpy.zeros((3, 4), dtype=numpy.int64))
    numpy.save(tmp_path / "floats.npy", numpy.zeros(4))
    (tmp_path / "odd.bin").write_bytes(b"\x00" * 5)
    numpy.save(tmp_path / "tokens.npy", numpy.arange(10, dtype=numpy.int64))
    numpy.save(tmp_path / "starts.npy", numpy.array([0, 5, 3]))
    cases = [
        (lambda: TokenFile("s3://bucket/tokens.npy"), ValueError,
         "token files are memory-mapped, so they must be local paths; 's3://bucket/tokens.npy' is not one (stream "
         "remote shards of documents with a ShardedStream and packed())"),
        (lambda: TokenFile(str(tmp_path / "odd.bin"), dtype="float32"), ValueError,
         f"token file {tmp_path / 'odd.bin'}: dtype 'float32' is not an integer dtype"),
        (lambda: TokenFile(str(tmp_path / "odd.bin"), eos_id=0, document_starts="x.npy"), ValueError,
         f"token file {tmp_path / 'odd.bin'}: give its document boundaries one way (eos_id, document_starts or a "
         "Megatron index), not several"),
        (lambda: TokenSequences([str(tmp_path / "matrix.npy")], 4), ValueError,
         f"token file {tmp_path / 'matrix.npy'} holds a int64 array of shape (3, 4), not a 1-D array of integer "
         "token ids"),
        (lambda: TokenSequences([str(tmp_path / "floats.npy")], 4), ValueError,
         f"token file {tmp_path / 'floats.npy'} holds a float64 array of shape (4,), not a 1-D array of integer "
         "token ids"),
        (lambda: TokenSequences([str(tmp_path / "odd.bin")], 4), ValueError,
         f"token file {tmp_path / 'odd.bin'} is not a .npy file: give the dtype of its tokens (dtype='uint16', say)"),
        (lambda: TokenSequences([TokenFile(str(tmp_path / "odd.bin"), dtype="uint16")], 4), ValueError,
         f"token file {tmp_path / 'odd.bin'} has 5 bytes, not a whole number of uint16 tokens"),
        (lambda: TokenSequences([TokenFile(str(tmp_path / "tokens.npy"), dtype="int32")], 4), ValueError,
         f"token file {tmp_path / 'tokens.npy'} holds int64 tokens, not int32"),
        (lambda: TokenSequences([TokenFile(str(tmp_path / "tokens.npy"), document_starts=str(tmp_path / "starts.npy"))],
                                4), ValueError,
         f"document starts {tmp_path / 'starts.npy'} are not in order within the file's 10 tokens"),
        (lambda: TokenSequences([], 4), ValueError, "TokenSequences needs at least one token file"),
    ]
    for make, kind, message in cases:
        with pytest.raises(kind) as error:
            make()
        assert str(error.value) == message


def test_malformed_megatron_indexes_are_refused_naming_them(tmp_path):
    prefix = write_megatron(tmp_path / "corpus", documents(0, [3, 4]), numpy.int32)
    index = Path(f"{prefix}.idx")
    good = index.read_bytes()

    def refused(data: bytes) -> str:
        index.write_bytes(data)
        with pytest.raises(ValueError) as error:
            TokenSequences([TokenFile.megatron(str(prefix))], 4)
        return str(error.value).removeprefix(f"{index} is not a Megatron-LM token index: ")

    assert refused(b"NOTANIDX" + good[8:]) == "it does not start with b'MMIDIDX\\x00\\x00'"
    assert refused(good[:9] + (2).to_bytes(8, "little") + good[17:]) == "version 2, this reader reads version 1"
    assert refused(good[:17] + bytes([7]) + good[18:]) == "its tokens are float32, not integer token ids"
    assert refused(good[:17] + bytes([9]) + good[18:]) == "unknown dtype code 9"
    assert refused(good + b"\x00\x00") == "it is multimodal (it holds sequence modes), which this reader does not read"
    assert refused(good[:-1]) == "81 bytes, where 2 sequences and 3 documents take 82"
    pointers = 34 + 8
    assert refused(good[:pointers] + (4).to_bytes(8, "little") + good[pointers + 8:]) == \
        "its sequences do not lie one after another in the .bin file"
    index.write_bytes(good)
    Path(f"{prefix}.bin").write_bytes(Path(f"{prefix}.bin").read_bytes()[:-4])
    with pytest.raises(ValueError) as error:
        TokenSequences([TokenFile.megatron(str(prefix))], 4)
    assert str(error.value) == f"token file {prefix}.bin holds 6 tokens; its index {index} says 7"
