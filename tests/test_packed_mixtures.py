"""Mixtures of packed sources (issue 34): a packed stream of documents and token files,
all of one seq_len, blended by weights that count real tokens (by default) or samples (one
position, one sequence of seq_len + 1 token slots): the global batches are the same through
resumes at other world sizes (G3), each source's sequences come in the composition's
counts, every document once per source-epoch; sources of different seq_len, or packed next
to unpacked ones, are refused, and so is a state of another seq_len, weighing or data."""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction

import numpy
import pytest
import torch

from dist_resume import Mixture, ResumableDataLoader, ResumeStateError
from dist_resume.packing import TokenFile, TokenSequences, collate_packed
from tests.packing_data import (assert_same_batches, check_documents, collate_rows, packed_stream, run_job,
                                total_tokens, write_documents)
from tests.token_file_data import documents, write_npy

SEQ_LEN = 11
FILE_LENGTHS = ((30, 2, 2, 41), (9, 9, 9, 9, 9))  # shards 10 and 11 of the token files
WEIGHTS = {"web": 0.7, "code": 0.3}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[TokenFile]]:
    root = tmp_path_factory.mktemp("mixture")
    urls = write_documents(str(root / "web"))
    files = []
    for shard, lengths in enumerate(FILE_LENGTHS, start=10):
        path, starts = write_npy(root / f"code-{shard}.npy", documents(shard, lengths))
        files.append(TokenFile(str(path), document_starts=str(starts)))
    return urls, files


def mixture(data, seq_len: int = SEQ_LEN, **options) -> Mixture:
    urls, files = data
    return Mixture({"web": packed_stream(urls, seq_len=seq_len, canonical_streams=6),
                    "code": TokenSequences(files, seq_len)}, WEIGHTS, **options)


def job(data, world_size, state, steps):
    return run_job(lambda rank, size: ResumableDataLoader(mixture(data), batch_size=6 // size, rank=rank,
                                                          world_size=size, collate_fn=collate_rows, even_batches=False),
                   world_size, state, steps)


def source_of(row: dict) -> str:
    return "code" if row["tokens"][0] // 100_000 >= 10 else "web"


def test_resized_twice_the_mixture_gives_the_uninterrupted_batches_in_the_weights_counts(data):
    whole, _ = job(data, 1, None, None)
    first, state = job(data, 2, None, 2)
    second, state = job(data, 3, state, 3)
    rest, final = job(data, 1, state, None)
    assert first + second + rest == whole
    rows = [row for step in whole for row in step]
    mix = mixture(data)
    # each source's sequences and real tokens: exactly the composition's over the epoch's positions
    progress = mix.progress(final)
    assert [sum(source_of(row) == name for row in rows) for name in mix.names] == \
        [progress[name].draws for name in mix.names] == mix.composition(0, False, 6).draws_before(len(rows))
    assert [sum(row["num_tokens"] for row in rows if source_of(row) == name) for name in mix.names] == \
        [progress[name].tokens for name in mix.names]
    # web (43 sequences) is drawn fewer times than it has: its draws are its first source-epoch's first sequences
    web_rows = [row for row in rows if source_of(row) == "web"]
    assert len({str(row["tokens"]) for row in web_rows}) == len(web_rows)
    # code's token files (10 sequences) are drawn more often: every sequence once per source-epoch
    code_rows = [row for row in rows if source_of(row) == "code"]
    assert len(code_rows) > mix.lengths[1]
    check_documents(code_rows[:mix.lengths[1]], ((),) * 10 + FILE_LENGTHS)


STAGED = [(0, WEIGHTS), (24, {"web": 1, "code": 1})]  # the second stage begins at step 4's end


def staged_job(data, world_size, state, steps, num_workers=0):
    urls, files = data
    return run_job(lambda rank, size: ResumableDataLoader(
        Mixture({"web": packed_stream(urls, seq_len=SEQ_LEN, canonical_streams=6),
                 "code": TokenSequences(files, SEQ_LEN)}, STAGED),
        batch_size=6 // size, rank=rank, world_size=size, collate_fn=collate_rows, num_workers=num_workers,
        drop_last=True),
        world_size, state, steps)


def test_through_resumes_and_resizes_each_step_holds_the_real_token_shares_within_a_sequence(data):
    """'code 0.3' is 30% of the real tokens trained: through a resume at 2 ranks x 2 workers,
    then 3 ranks, then 1, at every global step's end each source's real tokens since its
    stage began are within half a sequence of its share (two sources), and each step's own
    tokens within one sequence (seq_len + 1 tokens) of it."""
    whole, _ = staged_job(data, 1, None, None)
    first, state = staged_job(data, 2, None, 3, num_workers=2)
    second, state = staged_job(data, 3, state, 3)
    rest, _ = staged_job(data, 1, state, None)
    steps = first + second + rest
    assert steps == whole and len(steps) == 8  # 50 positions: the partial last step dropped
    code = [sum(row["num_tokens"] for row in step if source_of(row) == "code") for step in steps]
    real = [sum(row["num_tokens"] for row in step) for step in steps]
    for begin, end, share in ((0, 4, Fraction(3, 10)), (4, 8, Fraction(1, 2))):
        for at in range(begin + 1, end + 1):
            assert abs(sum(code[begin:at]) - share * sum(real[begin:at])) <= Fraction(SEQ_LEN + 1, 2)
            assert abs(code[at - 1] - share * real[at - 1]) <= SEQ_LEN + 1


def test_collate_packed_batches_of_a_mixture_are_the_same_whoever_reads_and_collates_their_rows(data):
    # Each worker makes its part of a batch (stream sequences and token-file sequences); the
    # main process joins them into the batch one process collates, across a change of workers.
    def loader(num_workers: int) -> ResumableDataLoader:
        return ResumableDataLoader(mixture(data), batch_size=5, num_workers=num_workers, collate_fn=collate_packed)

    whole = list(loader(0))
    assert_same_batches(list(loader(2)), whole)
    first = loader(3)
    before = list(itertools.islice(first, 4))
    resumed = loader(2)
    resumed.load_state_dict(first.state_dict())
    assert_same_batches(before + list(resumed), whole)


def test_weighing_samples_the_mixture_weighs_token_slots(data):
    mix = mixture(data, weigh="samples")
    assert mix.seq_len == SEQ_LEN and mix.tokens is None
    assert mix.lengths == (sum(packed_stream(data[0]).lengths()), len(TokenSequences(data[1], SEQ_LEN)))
    # over any window of a stage, a source's sequences (seq_len + 1 token slots each) are
    # within window_bound of its share
    sources, _ = mix.schedule.assign(torch.arange(1000))
    counts = numpy.cumsum(sources.numpy() == 1)
    for width in (10, 100, 1000):
        windows = counts[width - 1:] - numpy.concatenate([[0], counts[:-width]])
        assert numpy.abs(windows - 0.3 * width).max() < mix.window_bound("code")


def test_sources_of_different_seq_len_are_refused(data):
    urls, files = data
    with pytest.raises(ValueError) as error:
        Mixture({"web": packed_stream(urls, seq_len=11), "code": TokenSequences(files, 15)}, WEIGHTS)
    assert str(error.value) == ("Mixture packed sources disagree on seq_len (source 'web' has seq_len=11, source 'code' "
                                "has seq_len=15): its weights count tokens only if every sequence holds the same "
                                "seq_len + 1 of them; pack every source to one seq_len")


def test_packed_sources_next_to_unpacked_ones_are_refused(data):
    urls, files = data
    with pytest.raises(ValueError) as error:
        Mixture({"web": packed_stream(urls), "plain": list(range(10))}, {"web": 1, "plain": 1})
    assert str(error.value) == ("Mixture sources 'web' are packed token sequences and 'plain' are not: a mixture of "
                                "packed sources weighs tokens, so every source must be packed (packed() for a stream "
                                "of documents, TokenSequences for token files)")


@pytest.mark.parametrize("weigh", ["tokens", "samples"])
def test_a_state_of_another_seq_len_is_refused_naming_it(data, weigh):
    saved = ResumableDataLoader(mixture(data, weigh=weigh), batch_size=6, collate_fn=collate_rows)
    next(iter(saved))
    loader = ResumableDataLoader(mixture(data, seq_len=SEQ_LEN + 4, weigh=weigh), batch_size=6,
                                 collate_fn=collate_rows)
    with pytest.raises(ResumeStateError) as error:
        loader.load_state_dict(saved.state_dict())
    assert str(error.value) == ("loader state was saved for a Mixture of sources packed to seq_len=11; this "
                                "Mixture's sources are packed to seq_len=15")


def test_a_state_of_the_other_weighing_is_refused_naming_it(data):
    saved = ResumableDataLoader(mixture(data, weigh="samples"), batch_size=6, collate_fn=collate_rows)
    next(iter(saved))
    loader = ResumableDataLoader(mixture(data), batch_size=6, collate_fn=collate_rows)
    with pytest.raises(ResumeStateError) as error:
        loader.load_state_dict(saved.state_dict())
    assert str(error.value) == ("loader state was saved for a Mixture whose weights count samples; this Mixture's "
                                "weights count tokens (Mixture(weigh='samples') resumes it)")


def test_a_state_of_sources_whose_tokens_lie_otherwise_is_refused(data, tmp_path):
    """Same sequence counts, other real tokens: weights that count tokens would compose other
    positions, so the state cannot continue."""
    urls, files = data
    shorter = [*FILE_LENGTHS[:-1], FILE_LENGTHS[-1][:-1] + (8,)]  # one token less: as many sequences
    changed = []
    for shard, lengths in enumerate(shorter, start=10):
        path, starts = write_npy(tmp_path / f"code-{shard}.npy", documents(shard, lengths))
        changed.append(TokenFile(str(path), document_starts=str(starts)))
    saved = ResumableDataLoader(mixture(data), batch_size=6, collate_fn=collate_rows)
    next(iter(saved))
    other = Mixture({"web": packed_stream(urls, seq_len=SEQ_LEN, canonical_streams=6),
                     "code": TokenSequences(changed, SEQ_LEN)}, WEIGHTS)
    assert other.lengths == mixture(data).lengths
    with pytest.raises(ResumeStateError) as error:
        ResumableDataLoader(other, batch_size=6, collate_fn=collate_rows).load_state_dict(saved.state_dict())
    assert str(error.value) == ("loader state was saved for a Mixture whose weights count tokens over sources of "
                                f"'web' ({total_tokens()} real tokens), 'code' (120 real tokens); these sources hold "
                                f"'web' ({total_tokens()} real tokens), 'code' (119 real tokens): its positions' "
                                "sources follow the real tokens, so it cannot continue over other data")


def test_weighing_tokens_needs_packed_sources_and_weigh_is_one_of_two():
    with pytest.raises(ValueError) as error:
        Mixture({"a": list(range(4)), "b": list(range(4))}, {"a": 1, "b": 1}, weigh="tokens")
    assert str(error.value) == ("Mixture(weigh='tokens') needs packed sources (packed() streams, TokenSequences): "
                                "only their sequences' real tokens are known")
    with pytest.raises(ValueError, match=r"^Mixture weigh must be 'tokens' or 'samples' \(what the weights count\), "
                                         r"got 'slots'$"):
        Mixture({"a": list(range(4))}, {"a": 1}, weigh="slots")


def test_a_state_of_token_files_of_another_seq_len_with_the_same_lengths_is_refused(tmp_path):
    numpy.save(tmp_path / "a.npy", numpy.arange(100, dtype=numpy.int64))
    numpy.save(tmp_path / "b.npy", numpy.arange(100, dtype=numpy.int64))

    def loader(seq_len):
        sources = {"a": TokenSequences([str(tmp_path / "a.npy")], seq_len),
                   "b": TokenSequences([str(tmp_path / "b.npy")], seq_len)}
        return ResumableDataLoader(Mixture(sources, {"a": 1, "b": 1}, weigh="samples"), batch_size=2,
                                   collate_fn=collate_rows)

    saved = loader(9)  # 10 sequences of 10 tokens per source, as with seq_len 10 (the last one of 1)
    next(iter(saved))
    with pytest.raises(ResumeStateError) as error:
        loader(10).load_state_dict(saved.state_dict())
    assert str(error.value) == ("loader state was saved for a Mixture of sources packed to seq_len=9; this Mixture's "
                                "sources are packed to seq_len=10")


def unordered_job(data, world_size, state, steps, num_workers):
    return run_job(lambda rank, size: ResumableDataLoader(mixture(data), batch_size=6 // size, rank=rank,
                                                          world_size=size, collate_fn=collate_rows, even_batches=False,
                                                          num_workers=num_workers, in_order=False),
                   world_size, state, steps)


def test_read_in_any_order_through_resizes_every_position_is_trained_once_in_the_token_counts(data):
    """Weights in tokens with in_order=False: stopped at 2 ranks x 2 workers and resumed at 3
    ranks x 1 worker and 1 rank x 2 workers, the epoch trains the sequences of the epoch read
    in any order without a stop (each position once, whichever worker read it), and each
    source's real tokens are the ones its progress counted."""
    whole, _ = unordered_job(data, 1, None, None, num_workers=0)
    first, state = unordered_job(data, 2, None, 2, num_workers=2)
    second, state = unordered_job(data, 3, state, 2, num_workers=1)
    rest, final = unordered_job(data, 1, state, None, num_workers=2)

    def rows(steps):
        return Counter((tuple(row["tokens"]), row["num_tokens"]) for step in steps for row in step)

    assert rows(first + second + rest) == rows(whole)
    progress = mixture(data).progress(final)
    trained = [row for step in first + second + rest for row in step]
    assert [sum(row["num_tokens"] for row in trained if source_of(row) == name) for name in progress] == \
        [progress[name].tokens for name in progress]
