"""Mixture through ResumableDataLoader in one process: exact resume (G1), each source read
once per source-epoch across loader epochs (G2), the definition checked on load (G6),
reweighting a running job, per-source progress, `dist-resume inspect`, an S3 round trip."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader

from dist_resume import (
    Mixture,
    ResumableDataLoader,
    ResumeStateError,
    load_checkpoint,
    save_checkpoint,
)
from dist_resume.cli import main

from .datasets import Indices
from .mixture_datasets import LENGTHS, STAGES, mixture, samples
from .s3_server import s3_bucket, s3_endpoint, s3_store  # noqa: F401

SEED = 5


def _loader(mix: Mixture, **kwargs) -> ResumableDataLoader:
    kwargs = {"batch_size": 4, "shuffle": True, "seed": SEED, **kwargs}
    return ResumableDataLoader(mix, **kwargs)


def _run(loader: ResumableDataLoader, epochs: int) -> list[list[tuple]]:
    return [samples(batch) for _ in range(epochs) for batch in loader]


def _keys(batches: list[list[tuple]]) -> list[tuple[int, int]]:
    return [sample[:2] for batch in batches for sample in batch]


def test_the_loader_reads_the_mixture_positions_in_order() -> None:
    """The loader never permutes the mixture's positions: the samples of two epochs are
    the keys of run positions 0 .. 119 under its seed and shuffle, the stage change at
    position 50 included."""
    mix = mixture()
    keys = _keys(_run(_loader(mix), 2))
    assert keys == mix.keys(range(120), seed=SEED, shuffle=True)
    assert Counter(source for source, _ in keys[:50]) != Counter(source for source, _ in keys[60:110])


@pytest.mark.parametrize("shuffle", [True, False])
def test_G2_each_source_is_read_once_per_source_epoch_across_loader_epochs(shuffle: bool) -> None:
    """Over three loader epochs, each source's samples come in whole source-epochs: every
    sample once before any repeats; loader epoch 1 continues each source where epoch 0 left it."""
    batches = _run(_loader(mixture(), shuffle=shuffle), 3)
    for label, length in enumerate(LENGTHS.values()):
        read = [index for source, index in _keys(batches) if source == label]
        assert len(read) >= 2 * length
        for start in range(0, len(read), length):
            chunk = read[start : start + length]
            assert len(set(chunk)) == len(chunk)
            if len(chunk) == length:
                assert sorted(chunk) == list(range(length))
        if not shuffle:
            assert read[:length] == list(range(length))


@pytest.mark.parametrize("workers_before, workers_after", [(2, 0), (0, 2)])
def test_G1_resume_is_exact_at_any_worker_count(workers_before: int, workers_after: int) -> None:
    """Stopped mid-stage after 7 of 15 batches, a new loader continues with the same batches,
    augmentations included, into the next stage and the next epoch."""
    reference = _run(_loader(mixture()), 2)
    loader = _loader(mixture(), num_workers=workers_before)
    first = [samples(batch) for batch in itertools.islice(iter(loader), 7)]
    resumed = _loader(mixture(), num_workers=workers_after)
    resumed.load_state_dict(loader.state_dict())
    assert first + _run(resumed, 2)[: 30 - 7] == reference


@pytest.mark.parametrize("other, message", [
    (lambda: mixture([(start, {"novels" if k == "books" else k: w for k, w in weights.items()}) for start, weights in STAGES],
                     lengths={"web": 13, "code": 7, "novels": 5}),
     "loader state was saved for a Mixture of 'web' (13 samples), 'code' (7 samples), 'books' (5 samples); "
     "this Mixture has 'web' (13 samples), 'code' (7 samples), 'novels' (5 samples)"),
    (lambda: mixture(lengths={"web": 13, "code": 8, "books": 5}),
     "loader state was saved for a Mixture of 'web' (13 samples), 'code' (7 samples), 'books' (5 samples); "
     "this Mixture has 'web' (13 samples), 'code' (8 samples), 'books' (5 samples)"),
    (lambda: mixture(weights={"web": 0.5, "code": 0.3, "books": 0.2}),
     "loader state was saved with Mixture weights from 0: {web: 5, code: 3, books: 2}; from 50: "
     "{web: 1, code: 1, books: 2}; this Mixture has from 0: {web: 5, code: 3, books: 2} (quotas per stage); "
     "pass reweight=True to Mixture to apply its weights from the resume position on"),
    (lambda: Indices(60),
     "loader state was saved for a dataset with definition digest "),
])
def test_G6_a_state_of_another_mixture_is_refused(other, message: str) -> None:
    loader = _loader(mixture())
    next(iter(loader))
    with pytest.raises(ResumeStateError) as error:
        _loader(other()).load_state_dict(loader.state_dict())
    assert str(error.value).startswith(message)


def test_G6_a_plain_dataset_state_is_refused_by_a_mixture() -> None:
    loader = _loader(Indices(60))
    with pytest.raises(ResumeStateError, match="^loader state was saved without a Mixture; this loader's dataset is a Mixture$"):
        _loader(mixture()).load_state_dict(loader.state_dict())


def _rank_states(mix_factory, stops: list[int], world_size: int) -> tuple[dict, list[list[tuple]]]:
    """Ranks of one job (explicit rank/world_size) each consume stops[r] batches; returns
    their merged states and what each consumed."""
    merged, consumed = {}, []
    for rank, stop in enumerate(stops):
        loader = _loader(mix_factory(), rank=rank, world_size=world_size, even_batches=False)
        consumed.append([s for batch in itertools.islice(iter(loader), stop) for s in samples(batch)])
        merged.update(loader.state_dict())
    return merged, consumed


def test_reweight_applies_new_weights_from_past_every_consumed_position() -> None:
    """2 ranks stop unevenly (3 and 2 batches of 4: positions up to 23 served); a 3-rank job
    (no padding: even_batches=False)
    with reweight=True keeps the saved stages before position 24 and the new weights after:
    every position of the epoch is read once, the past reads what it read, each source still
    reads every sample once per source-epoch, and later resumes keep the merged schedule."""
    new_weights = {"web": 0, "code": 1, "books": 1}
    state, consumed = _rank_states(mixture, [3, 2], 2)
    original = mixture()
    loaders = [_loader(mixture(new_weights, reweight=True), rank=r, world_size=3, even_batches=False) for r in range(3)]
    for loader in loaders:
        loader.load_state_dict(state, independent_ranks=True)
    merged = loaders[0].dataset
    assert [(stage.start, stage.quotas) for stage in merged.schedule.stages] == [(0, (5, 3, 2)), (24, (0, 1, 1))]
    rest = [s for loader in loaders for batch in loader for s in samples(batch)]
    keys = [s[:2] for s in rest] + [s[:2] for rank in consumed for s in rank]
    assert Counter(keys) == Counter(merged.keys(range(60), seed=SEED, shuffle=True))
    assert merged.keys(range(24), seed=SEED, shuffle=True) == original.keys(range(24), seed=SEED, shuffle=True)
    assert all(key[0] != 0 for key in merged.keys(range(24, 60), seed=SEED, shuffle=True))
    for label, length in enumerate(LENGTHS.values()):
        read = [i for s, i in merged.keys(range(60), seed=SEED, shuffle=True) if s == label]
        assert all(len(set(read[k : k + length])) == len(read[k : k + length]) for k in range(0, len(read), length))
    again = _loader(mixture(new_weights, reweight=True), rank=0, world_size=3, even_batches=False)
    again.load_state_dict(loaders[0].state_dict() | loaders[1].state_dict() | loaders[2].state_dict(),
                          independent_ranks=True)
    assert again.dataset.schedule == merged.schedule


def test_reweight_needs_every_rank() -> None:
    state, _ = _rank_states(mixture, [3, 3], 2)
    own = {key: value for key, value in state.items() if key != "rank_1"}
    with pytest.raises(ResumeStateError, match="changing a Mixture's weights needs every rank's state"):
        _loader(mixture({"web": 1, "code": 1, "books": 1}, reweight=True), even_batches=False).load_state_dict(own)


def test_progress_counts_the_draws_of_each_source() -> None:
    """After 11 batches of 4 (stage 0 then 4 positions of stage 1), progress() from the
    state or the position gives each source's draws and source-epoch."""
    mix = mixture()
    loader = _loader(mix)
    keys = _keys([samples(batch) for batch in itertools.islice(iter(loader), 11)])
    progress = mix.progress(loader.state_dict())
    assert progress == mix.progress(44)
    for label, (name, length) in enumerate(LENGTHS.items()):
        draws = sum(1 for source, _ in keys if source == label)
        assert (progress[name].draws, progress[name].epoch, progress[name].within) == (draws, draws // length, draws % length)


def test_inspect_shows_the_mixture_of_a_checkpoint(tmp_path, capsys) -> None:
    mix = mixture()
    loader = _loader(mix)
    for _ in itertools.islice(iter(loader), 11):
        pass
    save_checkpoint({"loader": loader}, str(tmp_path), 3)
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    progress = mix.progress(44)
    assert ("  mixture of 3 sources, weights (quotas) from 0: {web: 5, code: 3, books: 2}; "
            "from 50: {web: 1, code: 1, books: 2}\n"
            "  run position 44 (epoch 0, position 44): every consumed position is below it\n") in out
    web = progress["web"]
    assert (f"  source 'web': {web.draws} draws, in source-epoch {web.epoch} with {web.within} of 13 samples read"
            in out)


def test_checkpoint_round_trip_on_s3(s3_store: str) -> None:  # noqa: F811
    reference = _run(_loader(mixture(), num_workers=2), 2)
    loader = _loader(mixture())
    first = [samples(batch) for batch in itertools.islice(iter(loader), 9)]
    save_checkpoint({"loader": loader}, f"{s3_store}/mix", 9)
    resumed = _loader(mixture(), num_workers=2)
    assert load_checkpoint({"loader": resumed}, f"{s3_store}/mix") == 9
    assert first + _run(resumed, 2)[:21] == reference


def test_a_plain_dataloader_reads_positions_in_natural_source_order() -> None:
    mix = mixture()
    indices = [s[:2] for batch in DataLoader(mix, batch_size=6) for s in samples(batch)]
    assert indices == mix.keys(range(60))


def test_hugging_face_datasets_are_sources() -> None:
    datasets = pytest.importorskip("datasets")
    text = datasets.Dataset.from_dict({"text": [f"doc {i}" for i in range(9)]})
    mix = Mixture({"hf": text, "torch": Indices(4)}, {"hf": 2, "torch": 1}, length=12)
    read = [sample for batch in _loader(mix, batch_size=None) for sample in [batch]]
    keys = mix.keys(range(12), seed=SEED, shuffle=True)
    assert read == [text[index] if source == 0 else index for source, index in keys]


@pytest.mark.parametrize("sources, weights, message", [
    ({}, {}, "Mixture needs a non-empty mapping"),
    ({"a": Indices(3), "": Indices(2)}, {"a": 1, "": 1}, "Mixture source names must be non-empty strings"),
    ({"a": Indices(3), "b": Indices(0)}, {"a": 1, "b": 1}, "Mixture source 'b' is empty"),
    ({"a": Indices(3), "b": Indices(2)}, {"a": 1}, r"must give a weight to every source \['a', 'b'\] \(missing \['b'\]"),
    ({"a": Indices(3)}, [(5, {"a": 1})], "the first mixture stage must start at position 0, got 5"),
    ({"a": Indices(3)}, [(0, {"a": 1}), (0, {"a": 2})], "mixture stage starts must increase, got 0 then 0"),
    ({"a": Indices(3)}, [], "the list of stages is empty"),
])
def test_a_bad_definition_is_one_clear_error(sources, weights, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Mixture(sources, weights)


@pytest.mark.parametrize("corrupt, message", [
    (lambda values: values[:-1], "loader state's mixture definition is malformed"),
    (lambda values: torch.cat([values, torch.tensor([7])]), "loader state's mixture definition is malformed"),
    (lambda values: values.float(), "loader state's 'dataset_definition' is not a 1-D int64 tensor"),
])
def test_G6_a_malformed_definition_is_one_clear_error(corrupt, message: str) -> None:
    loader = _loader(mixture())
    state = loader.state_dict()
    state["dataset_definition"] = corrupt(state["dataset_definition"])
    with pytest.raises(ResumeStateError, match=f"^{message}$"):
        _loader(mixture()).load_state_dict(state)


def test_a_refused_state_leaves_a_reweighting_mixture_as_it_was() -> None:
    """A state refused for another reason (here its seed) does not re-weight the mixture."""
    state, _ = _rank_states(mixture, [3, 3], 2)
    mix = mixture({"web": 1, "code": 1, "books": 1}, reweight=True)
    requested = mix.schedule
    with pytest.raises(ResumeStateError, match="loader state was saved with seed 5; this loader has seed 6"):
        _loader(mix, seed=6, even_batches=False).load_state_dict(state)
    assert mix.schedule == requested
