"""A Mixture of packed sources whose weights count real tokens (issue 34), end to end
(hypothesis over random documents, shards, seq_len, weights, stages, shuffling and
canonical streams): the real tokens each source's sequences hold are the ones the
composition counted (every padded sequence where the arithmetic puts it), so at the end of
every global step each source's real tokens since its stage began are within
`(1 + w (S - 2)) (seq_len + 1) / 2` of its share of all of them (half a sequence for two
sources), and every step within twice that. A source packed "fit" is counted at its
average fill: exact at each of its source-epochs' ends only."""

from __future__ import annotations

import itertools
import json
import os
from fractions import Fraction

import numpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_resume import JsonlReader, Mixture, ResumableDataLoader, ShardedStream
from dist_resume.mixtures.token_pacing import token_bound
from dist_resume.packing import TokenFile, TokenSequences, packed
from tests.packing_data import collate_rows, token
from tests.token_file_data import documents, write_npy

SHARD_SPAN = 20  # source k's shards are numbered from 20 * k: a token says its source


def source_of(row: dict) -> int:
    return row["tokens"][0] // 100_000 // SHARD_SPAN


def write_stream(root: str, source: int, shards: list[list[int]]) -> list[str]:
    os.makedirs(root, exist_ok=True)
    urls = []
    for shard, lengths in enumerate(shards):
        url = os.path.join(root, f"{source}-{shard}.jsonl")
        with open(url, "w") as file:
            file.writelines(json.dumps({"tokens": [token(SHARD_SPAN * source + shard, d, j) for j in range(length)]})
                            + "\n" for d, length in enumerate(lengths))
        urls.append(url)
    return urls


def make_source(root, source, kind, shards, seq_len, stream_shuffle, window):
    if kind == "file":
        files = []
        for shard, lengths in enumerate(shards):
            path, starts = write_npy(root / f"{source}-{shard}.npy", documents(SHARD_SPAN * source + shard, lengths))
            files.append(TokenFile(str(path), document_starts=str(starts)))
        return TokenSequences(files, seq_len)
    documents_ = ShardedStream(write_stream(str(root), source, shards), JsonlReader(), shuffle=stream_shuffle,
                               window=window, seed=source)
    return packed(documents_, seq_len, mode=kind, field="tokens")


shard_lists = st.lists(st.lists(st.integers(0, 30), max_size=6), min_size=1, max_size=4).filter(
    lambda shards: sum(map(sum, shards)) > 0)
mixtures = st.fixed_dictionaries({
    "kinds": st.lists(st.sampled_from(["concat", "concat", "file", "fit"]), min_size=2, max_size=3),
    "seq_len": st.integers(2, 12),
    "stream_shuffle": st.booleans(), "window": st.integers(1, 4), "loader_shuffle": st.booleans(),
    "canonical_streams": st.integers(1, 3), "batch_size": st.integers(1, 5), "seed": st.integers(0, 3),
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mixtures, st.data())
def test_each_step_holds_each_source_within_its_token_bound(tmp_path_factory, setup, data):
    root = tmp_path_factory.mktemp("weights")
    count = len(setup["kinds"])
    sources = {f"s{k}": make_source(root, k, kind, data.draw(shard_lists), setup["seq_len"], setup["stream_shuffle"],
                                    setup["window"]) for k, kind in enumerate(setup["kinds"])}
    weights = [{name: data.draw(st.integers(0, 9)) for name in sources} for _ in range(2)]
    weights = [stage for stage in weights if any(stage.values())] or [{name: 1 for name in sources}]
    stages = [(0, weights[0])] + ([(data.draw(st.integers(1, 40)), weights[1])] if len(weights) > 1 else [])
    streams = any(kind != "file" for kind in setup["kinds"])
    mixture = Mixture(sources, stages, canonical_streams=setup["canonical_streams"] if streams else None)
    assert mixture.weigh == "tokens" and mixture.tokens is not None
    loader = ResumableDataLoader(mixture, batch_size=setup["batch_size"], shuffle=setup["loader_shuffle"],
                                 seed=setup["seed"], collate_fn=collate_rows, drop_last=True)
    steps = list(itertools.islice(loader, min(60, 2 * mixture.length // setup["batch_size"])))
    composition = mixture.composition(setup["seed"], setup["loader_shuffle"], setup["canonical_streams"])
    width = setup["seq_len"] + 1
    exact = [kind != "fit" for kind in setup["kinds"]]
    batch = setup["batch_size"]
    real = [[0] * count]  # each source's real tokens after each step (a step's rows come in no position order)
    for step in steps:
        real.append(list(real[-1]))
        for row in step:
            real[-1][source_of(row)] += row["num_tokens"]

    def counted(position):
        draws = composition.draws_before(position)
        return [composition.draws[source].before_one(draws[source]) for source in range(count)], draws

    for step, totals in enumerate(real):
        tokens, draws = counted(step * batch)
        for source in range(count):
            if exact[source] or draws[source] % mixture.lengths[source] == 0:
                assert totals[source] == tokens[source], (source, step)
    if not all(exact):
        return
    for index, stage in enumerate(composition.stages):
        end = composition.stages[index + 1].start if index + 1 < len(composition.stages) else len(steps) * batch
        inside = [step for step in range(len(real)) if stage.start <= step * batch <= end]
        base = counted(stage.start)[0]  # exact, as the step boundaries' are: the stage may begin inside a step
        share = [Fraction(quota, sum(stage.quotas)) for quota in stage.quotas]
        bounds = [token_bound(stage.quotas, source, width) for source in range(count)]
        for first, last in [(None, step) for step in inside] + list(itertools.combinations(inside, 2)):
            before = base if first is None else real[first]
            drawn = [after - earlier for after, earlier in zip(real[last], before)]
            factor = 1 if first is None else 2  # since the stage began; any window of steps inside it
            for source in range(count):
                assert abs(drawn[source] - share[source] * sum(drawn)) <= factor * bounds[source], (source, first, last)


@pytest.mark.parametrize("canonical_streams", [1, 3])
def test_a_fit_source_is_counted_at_its_average_fill(tmp_path, canonical_streams):
    """'fit' pads wherever a document does not fit: the Mixture knows each shard's real
    tokens, not each sequence's, and paces the source at its average fill, which is exact
    at its source-epochs' ends."""
    fit = make_source(tmp_path, 0, "fit", [[7, 7, 7, 3], [11, 2], [5, 9, 9]], 9, True, 2)
    concat = make_source(tmp_path, 1, "concat", [[30, 12], [25]], 9, False, 1)
    mixture = Mixture({"fit": fit, "concat": concat}, {"fit": 1, "concat": 1}, canonical_streams=canonical_streams)
    composition = mixture.composition(0, False, canonical_streams)
    sequences, tokens = mixture.lengths[0], mixture.tokens[0]
    assert tokens == sum(7 * 3 + 3 + 11 + 2 + 5 + 9 + 9 for _ in range(1))
    assert [composition.draws[0].before_one(n) for n in (0, sequences, 2 * sequences)] == [0, tokens, 2 * tokens]
    assert composition.draws[0].before_one(1) == tokens // sequences
