"""`loader.skip(batches)`: the next global batches are passed over unread, count as consumed
(G2), are recorded in the state and stay skipped across resumes at any layout."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import IterableDataset, SequentialSampler

from dist_resume import ResumableDataLoader, plan_resume, save_checkpoint
from dist_resume.cli import main
from dist_resume.positions.epoch_order import EpochOrder
from dist_resume.state.fields import ResumeStateError
from dist_resume.state.skips import SKIPS_KEY, SkippedRange
from tests.merged_states import merged_from
from tests.skip_worker import ReadLog, reads

LENGTH, SEED = 20, 3


def _loader(path: Path, num_workers: int = 0, **options) -> ResumableDataLoader:
    options = {"batch_size": 3, "shuffle": True, "seed": SEED, **options}
    return ResumableDataLoader(ReadLog(LENGTH, str(path)), num_workers=num_workers, **options)


def _indices(positions) -> list[int]:
    return EpochOrder(LENGTH, SEED, 0, True).indices(torch.tensor(list(positions)))


def _flat(batches) -> list[int]:
    return [i for batch in batches for i in batch.tolist()]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_passes_over_batches_without_reading_them(tmp_path: Path, num_workers: int) -> None:
    """G2: after 1 batch, a state is saved; the resumed loader skips 2 global batches
    (positions 3-8): it trains positions 9-19 and never reads the skipped samples."""
    first = _loader(tmp_path / "first.log", num_workers)
    assert _flat([next(iter(first))]) == _indices(range(3))
    state = first.state_dict()
    log = tmp_path / "resumed.log"
    resumed = _loader(log, num_workers)
    resumed.load_state_dict(state)
    assert resumed.skip(2) == 2
    assert _flat(resumed) == _indices(range(9, 20))
    assert sorted(reads(log)) == sorted(_indices(range(9, 20)))  # nothing skipped was read
    assert resumed.skipped == (SkippedRange(0, 1, 3, 0, 3, 9, 2, 6),)
    assert str(resumed.skipped[0]) == "epoch 0: global batches 1 to 2 (2), positions 3 to 8 (6)"


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_before_the_first_batch_and_into_the_next_epoch(tmp_path: Path, num_workers: int) -> None:
    """A skip applies to the epoch the next iter() serves: a fresh loader's first epoch,
    and after an epoch's end, the next one."""
    log = tmp_path / "reads.log"
    loader = _loader(log, num_workers, persistent_workers=num_workers > 0)
    assert loader.skip(5) == 5
    assert _flat(loader) == _indices(range(15, 20))
    assert loader.skip(1) == 1
    assert loader.epoch == 1
    epoch_1 = EpochOrder(LENGTH, SEED, 1, True).indices(torch.arange(3, LENGTH))
    assert _flat(loader) == epoch_1
    assert sorted(reads(log)) == sorted(_indices(range(15, 20)) + epoch_1)
    assert [str(r) for r in loader.skipped] == ["epoch 0: global batches 0 to 4 (5), positions 0 to 14 (15)",
                                                "epoch 1: global batches 0 to 0 (1), positions 0 to 2 (3)"]


def test_skip_with_a_live_iterator_drops_its_prefetched_batches(tmp_path: Path) -> None:
    """As load_state_dict, skip takes effect at the next iter(): the running iterator stops
    with an error, and what its workers prefetched is never yielded."""
    loader = _loader(tmp_path / "reads.log", 2, prefetch_factor=2)
    iterator = iter(loader)
    assert _flat([next(iterator)]) == _indices(range(3))
    loader.skip(2)
    with pytest.raises(RuntimeError, match=r"iterator is stale: .* load_state_dict\(\)/set_epoch\(\)/skip\(\) moved it"):
        next(iterator)
    assert _flat(loader) == _indices(range(9, 20))


def test_skip_past_the_end_stops_at_it_and_says_so(tmp_path: Path) -> None:
    """7 batches of 20 samples: after 5, skip(4) skips the 2 left (5 positions), warns, and
    returns 2; the next iter() yields nothing, the one after starts epoch 1."""
    loader = _loader(tmp_path / "reads.log")
    assert len(_flat(batch for _, batch in zip(range(5), loader))) == 15
    with pytest.warns(UserWarning) as caught:
        assert loader.skip(4) == 2
    assert [str(w.message) for w in caught] == [
        "ResumableDataLoader.skip(4) stopped at the end of epoch 0: 2 global batches were left in it and "
        "skipped; the next epoch is not skipped into"]
    assert str(loader.skipped[0]) == "epoch 0: global batches 5 to 6 (2), positions 15 to 19 (5)"
    assert list(loader) == []
    assert _flat(loader) == EpochOrder(LENGTH, SEED, 1, True).indices(torch.arange(LENGTH))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loader.skip(0) == 0


def test_skip_refuses_bad_arguments_and_what_it_cannot_skip(tmp_path: Path) -> None:
    loader = _loader(tmp_path / "reads.log")
    with pytest.raises(TypeError, match=r"^batches must be an int, got bool True$"):
        loader.skip(True)
    with pytest.raises(TypeError, match=r"^batches must be an int, got float 2.0$"):
        loader.skip(2.0)
    with pytest.raises(ValueError, match=r"^batches must be an int >= 0, got -1$"):
        loader.skip(-1)
    assert loader.skipped == ()

    class Numbers(IterableDataset):
        def __iter__(self):
            return iter(range(6))

    supported = ("skip() supports a map-style dataset, a Mixture or a ShardedStream (and Mixtures of them) in the "
                 "loader's own order")
    with pytest.raises(ValueError, match=f"^{re.escape(supported)}; this loader reads an IterableDataset other than a "
                                         "ShardedStream, whose stream has no positions to skip to$"):
        ResumableDataLoader(Numbers(), batch_size=2).skip(1)
    with pytest.raises(ValueError, match=f"^{re.escape(supported)}; this loader takes its indices from a custom "
                                         "sampler or batch_sampler$"):
        ResumableDataLoader(list(range(6)), batch_size=2, sampler=SequentialSampler(range(6))).skip(1)


def _job(world_size: int, batch_size: int, path: Path) -> list[ResumableDataLoader]:
    return [ResumableDataLoader(ReadLog(30, str(path)), batch_size=batch_size, shuffle=False, seed=1, rank=rank,
                                world_size=world_size, even_batches=False) for rank in range(world_size)]


def test_skips_survive_a_resume_at_another_world_size_and_batch_size(tmp_path: Path) -> None:
    """G2: 2 ranks x 3 consume 1 step, skip 2 (positions 6-17), save; 3 ranks x 1 resume,
    skip 1 more (18-20) and train the rest: 0-5 and 21-29, each once; the ranges merge."""
    log = tmp_path / "reads.log"
    before = _job(2, 3, log)
    trained = [_flat([next(iter(loader))]) for loader in before]
    assert [loader.skip(2) for loader in before] == [2, 2]
    plan = plan_resume(merged_from(before), 3, 1)  # what `dist-resume plan` shows: the skipped are consumed
    assert sorted(p for rank in range(3) for batch in plan.batches(rank)
                  for p in batch.positions[:len(batch.positions) - batch.padding]) == list(range(18, 30))
    after = _job(3, 1, log)
    for loader in after:
        loader.load_state_dict(merged_from(before))
        assert loader.skip(1) == 1
    trained += [_flat(loader) for loader in after]
    assert sorted(i for part in trained for i in part) == list(range(6)) + list(range(21, 30))
    assert sorted(reads(log)) == list(range(6)) + list(range(21, 30))
    assert [str(r) for r in after[0].skipped] == ["epoch 0: global batches 1 to 3 (3), positions 6 to 20 (15)"]
    assert all(loader.skipped == after[0].skipped for loader in after)


def test_a_state_whose_ranks_skipped_differently_is_refused(tmp_path: Path) -> None:
    loaders = _job(2, 3, tmp_path / "reads.log")
    loaders[0].skip(1)
    loaders[1].skip(2)
    with pytest.raises(ResumeStateError, match=(
            r"^loader state entries disagree on the skipped ranges \(rank 0: epoch 0: global batches 0 to 0 \(1\), "
            r"positions 0 to 5 \(6\); rank 1: epoch 0: global batches 0 to 1 \(2\), positions 0 to 11 \(12\)\): "
            r"every rank must call skip\(\) with the same number of batches$")):
        _job(3, 1, tmp_path / "reads.log")[0].load_state_dict(merged_from(loaders))


def test_a_malformed_skip_record_is_refused(tmp_path: Path) -> None:
    loader = _loader(tmp_path / "reads.log")
    state = loader.state_dict()
    state["rank_0"][SKIPS_KEY] = torch.tensor([0, 0, 1, 0, 5, 0, 0, 2, 0, 1, 0], dtype=torch.int64)
    with pytest.raises(ResumeStateError, match=(
            r"^loader state entry 'rank_0''s 'skipped' tensor holds an impossible range \(0, 5, 0, 0, 2, 0, 1, 0\)$")):
        _loader(tmp_path / "reads.log").load_state_dict(state)
    state["rank_0"][SKIPS_KEY] = torch.tensor([0, 0, 2, 1], dtype=torch.int64)
    with pytest.raises(ResumeStateError, match=r"has 4 values, which no list of at most 8 skipped ranges has$"):
        _loader(tmp_path / "reads.log").load_state_dict(state)


def test_inspect_shows_what_was_skipped(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    loaders = _job(2, 3, tmp_path / "reads.log")
    for loader in loaders:
        next(iter(loader))
        loader.skip(2)
    url = str(tmp_path / "ckpt")
    save_checkpoint({"loader": merged_from(loaders)}, url, 4)
    assert main(["inspect", url]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "step 4: data loader state of 2 rank(s) under 'loader'",
        "  dataset 30 samples, seed 1, shuffle off, drop_last off, even_batches off",
        "  saved at world size 2, per-rank batch 3 (global batch 6)",
        "  rank 0: epoch 0 (in progress), 3 batches = 9 samples consumed this epoch",
        "  rank 1: epoch 0 (in progress), 3 batches = 9 samples consumed this epoch",
        "  skipped by loader.skip(), never trained (global batches and positions of each epoch):",
        "    epoch 0: global batches 1 to 2 (2), positions 6 to 17 (12)",
    ]


def test_a_mixture_skips_by_position_too() -> None:
    """A Mixture maps positions to (source, index) itself: the resumed ranks train the
    uninterrupted run's samples minus the skipped global batches 1-3, at another world size."""
    from tests.mixture_datasets import mixture, samples

    def loaders(world_size: int) -> list[ResumableDataLoader]:
        return [ResumableDataLoader(mixture(), batch_size=4, seed=9, rank=rank, world_size=world_size,
                                    even_batches=False) for rank in range(world_size)]

    reference = [[samples(batch) for batch in loader] for loader in loaders(2)]
    positions = {p: batch[i] for rank, batches in enumerate(reference) for step, batch in enumerate(batches)
                 for i, p in enumerate(range(step * 8 + rank * 4, step * 8 + rank * 4 + len(batch)))}
    job = loaders(2)
    trained = [samples(next(iter(loader))) for loader in job]
    assert [loader.skip(3) for loader in job] == [3, 3]
    resumed = loaders(1)[0]
    resumed.load_state_dict(merged_from(job))
    trained += [samples(batch) for batch in resumed]
    assert sorted(s for batch in trained for s in batch) == sorted(
        positions[p] for p in [*range(8), *range(32, 60)])
    assert [str(r) for r in resumed.skipped] == ["epoch 0: global batches 1 to 3 (3), positions 8 to 31 (24)"]



def test_after_the_epochs_end_no_rank_skips_any_of_it(tmp_path: Path) -> None:
    """even_batches=False, 20 samples, 2 ranks x 3: rank 0 serves 4 batches, rank 1 three.
    Resumed from a state saved once both are done, skip finds nothing left on either rank
    (rank 1 must not skip rank 0's final batch), so their records agree."""
    def job() -> list[ResumableDataLoader]:
        return [ResumableDataLoader(ReadLog(20, str(tmp_path / "reads.log")), batch_size=3, seed=1, rank=rank,
                                    world_size=2, even_batches=False) for rank in range(2)]

    done = job()
    for loader, batches in zip(done, (4, 3)):  # every batch, the pass not yet ended
        iterator = iter(loader)
        for _ in range(batches):
            next(iterator)
    resumed = job()
    for loader in resumed:
        loader.load_state_dict(merged_from(done))
        with pytest.warns(UserWarning, match=r"^ResumableDataLoader.skip\(1\) stopped at the end of epoch 0: 0 global"):
            assert loader.skip(1) == 0
        assert loader.skipped == ()
        assert list(loader) == []


def test_set_epoch_after_a_skip_keeps_it(tmp_path: Path) -> None:
    """A resumed loop calls set_epoch unconditionally: it keeps the skipped position."""
    loader = _loader(tmp_path / "reads.log")
    loader.skip(2)
    loader.set_epoch(0)
    assert _flat(loader) == _indices(range(6, 20))


def test_lightning_saves_every_ranks_skips(tmp_path: Path) -> None:
    """Under DDP, LightningLoader rebuilds every rank's entry from its own: the skipped
    ranges go into each, so a resume at another world size keeps them."""
    from dist_resume import LightningLoader

    job = _job(2, 3, tmp_path / "reads.log")
    job[0].skip(2)
    state = LightningLoader(job[0]).state_dict()
    assert torch.equal(state["rank_1"][SKIPS_KEY], state["rank_0"][SKIPS_KEY])
    resumed = _job(3, 2, tmp_path / "reads.log")[0]
    resumed.load_state_dict(state)
    assert [str(r) for r in resumed.skipped] == ["epoch 0: global batches 0 to 1 (2), positions 0 to 11 (12)"]
    assert _flat(resumed) == [12, 13, 18, 19, 24, 25]
