"""ResumableDataLoader in real multi-process gloo jobs: stop, save, resume at the same or
another world size and `num_workers` (G1-G4).

One spawn of 4 processes runs every job of `JOBS` in turn, each in a fresh process group of
its own size (ranks above it sit the job out); the tests compare what each rank consumed with
a single-process reference (world_size=1, batch_size = the global batch, no process group).
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist

from dist_resume import ResumableDataLoader, plan_resume, shut_down_distributed
from dist_resume.positions.epoch_order import EpochOrder

from .datasets import Augmented
from .merged_states import merged
from .script_processes import spawn_ranks

LENGTH = 41
SEED = 11
EPOCHS = 2  # a resumed job finishes the interrupted epoch and runs the next one


class Job(NamedTuple):
    """One process group. `stop[r]`: batches rank r consumes (across epochs) before saving
    its state; None runs to the end of epoch EPOCHS-1 (calling set_epoch before each epoch
    if `set_epoch`). `load`: the job whose saved states are loaded (`own_state`: only this
    rank's entry, else every saved rank's, merged)."""

    world_size: int
    batch_size: int
    num_workers: int = 0
    persistent_workers: bool = False
    stop: tuple[int, ...] | None = None
    load: str | None = None
    own_state: bool = False
    set_epoch: bool = False
    even_batches: bool = True
    subgroups: bool = False  # shard over dist.new_group data-parallel groups {0,2} and {1,3}


JOBS = {
    # G1: same world size; ranks stopped after different counts; 2 workers -> 0.
    "same_full": Job(2, 3),
    "same_stop": Job(2, 3, num_workers=2, stop=(4, 2)),
    "same_resume": Job(2, 3, load="same_stop", own_state=True),
    # G2-G4: 2 ranks x 6 -> 3 ranks x 4 (global batch 12 kept); 0 workers -> 2, persistent.
    "grow_stop": Job(2, 6, stop=(2, 2)),
    "grow_resume": Job(3, 4, num_workers=2, persistent_workers=True, load="grow_stop", set_epoch=True),
    # G2, G4: 3 ranks x 2 stopped unevenly (rank 0 at the end of its epoch) -> 2 ranks x 4
    # stopped unevenly again -> 4 ranks x 1; 2 workers, then 0.
    "uneven_stop": Job(3, 2, num_workers=2, stop=(7, 2, 3)),
    "uneven_again": Job(2, 4, num_workers=2, stop=(1, 2), load="uneven_stop"),
    "uneven_end": Job(4, 1, load="uneven_again", set_epoch=True),
    # G1 after an elastic resume: the 2x4 job above uninterrupted, and resumed (own entry).
    "uneven_again_full": Job(2, 4, load="uneven_stop"),
    "uneven_again_resume": Job(2, 4, num_workers=2, persistent_workers=True, load="uneven_again", own_state=True),
    # ... and stopped at the end of epoch 0 (rank 0) and 1 batch into epoch 1 (rank 1).
    "skew_stop": Job(2, 4, load="uneven_stop", stop=(3, 4)),
    "skew_resume": Job(2, 4, load="skew_stop"),
    # G2 with even_batches=False (no padding; ranks may get a batch less): 3x2 -> 2x4.
    "no_pad_stop": Job(3, 2, stop=(4, 6, 5), even_batches=False),
    "no_pad_resume": Job(2, 4, num_workers=2, load="no_pad_stop", even_batches=False),
    # G2-G4: 4 ranks x 2 -> 1 rank x 8.
    "one_stop": Job(4, 2, stop=(3, 3, 3, 3)),
    "one_resume": Job(1, 8, num_workers=2, load="one_stop"),
    # process_group= a subgroup: the shard is the rank within the group.
    "subgroup_stop": Job(4, 3, stop=(2, 2, 2, 2), subgroups=True),
    "subgroup_resume": Job(4, 3, load="subgroup_stop", subgroups=True),
}
MAX_WORLD = max(job.world_size for job in JOBS.values())


class Consumed(NamedTuple):
    """What one rank of one job consumed: per batch (epoch, samples); for each epoch it
    began, the padding positions and len() it reported before iterating."""

    batches: list[tuple[int, list[tuple]]]
    padding: dict[int, list[int]]
    lengths: dict[int, int]


def _samples(batch: dict[str, torch.Tensor]) -> list[tuple]:
    """(index, torch, random, numpy) per sample of a collated batch of `Augmented`."""
    return list(zip(*(batch[key].tolist() for key in ("index", "torch", "random", "numpy"))))


def _serve(loader: ResumableDataLoader, set_epoch: bool, consumed: Consumed) -> Iterator[None]:
    """Iterates the loader up to the end of epoch EPOCHS-1, recording into `consumed`;
    yields after each batch."""
    for next_epoch in range(loader.epoch, EPOCHS):
        if set_epoch:
            loader.set_epoch(next_epoch)
        epoch = loader.epoch
        consumed.padding[epoch] = loader.padding_positions()
        consumed.lengths[epoch] = len(loader)
        for batch in loader:
            consumed.batches.append((epoch, _samples(batch)))
            yield


def _saved_states(out: Path, name: str, ranks: Iterable[int]) -> dict[str, Any]:
    """The merged states that `ranks` of job `name` saved."""
    return merged(*(torch.load(out / f"{name}-state-{rank}.pt", weights_only=True) for rank in ranks))


def _run_job(name: str, job: Job, rank: int, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{out}/store-{name}", rank=rank, world_size=job.world_size,
        timeout=timedelta(seconds=60),
    )
    # Every rank of an earlier job saved before it left that job's final barrier.
    dist.barrier()
    group = None
    if job.subgroups:
        groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        group = groups[rank % 2]
    loader = ResumableDataLoader(
        Augmented(LENGTH), batch_size=job.batch_size, shuffle=True, seed=SEED, num_workers=job.num_workers,
        persistent_workers=job.persistent_workers, process_group=group, even_batches=job.even_batches,
    )
    if job.load:
        ranks = [loader.rank] if job.own_state else range(JOBS[job.load].world_size)
        state = _saved_states(out, job.load, ranks)
        loader.load_state_dict(state, independent_ranks=True)  # ranks stop where each stops
    consumed = Consumed([], {}, {})
    if job.stop is None:
        for _ in _serve(loader, job.set_epoch, consumed):
            pass
    else:
        for _ in itertools.islice(_serve(loader, job.set_epoch, consumed), job.stop[rank]):
            pass
        torch.save(loader.state_dict(), out / f"{name}-state-{rank}.pt")
    torch.save(tuple(consumed), out / f"{name}-consumed-{rank}.pt")
    shut_down_distributed()


def _rank_main(rank: int, out: Path) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    # As under torchrun: loader workers fork (the fork server's children would use it).
    multiprocessing.set_start_method("fork", force=True)
    for name, job in JOBS.items():
        if rank < job.world_size:
            _run_job(name, job, rank, out)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs every job of JOBS; returns the directory of their states and `Consumed` files."""
    out = tmp_path_factory.mktemp("loader_distributed")
    spawn_ranks(_rank_main, args=(out,), nprocs=MAX_WORLD)
    return out


def _consumed(out: Path, name: str) -> list[Consumed]:
    return [Consumed(*torch.load(out / f"{name}-consumed-{rank}.pt")) for rank in range(JOBS[name].world_size)]


def _reference(global_batch: int) -> list[list[list[tuple]]]:
    """Per epoch, the global steps of an uninterrupted run at world size 1."""
    loader = ResumableDataLoader(Augmented(LENGTH), batch_size=global_batch, shuffle=True, seed=SEED, rank=0, world_size=1)
    return [[_samples(batch) for batch in loader] for _ in range(EPOCHS)]


def _indices(epoch: int, positions: list[int]) -> list[int]:
    return EpochOrder(LENGTH, SEED, epoch, True).indices(torch.tensor(positions, dtype=torch.int64))


def _batches(rank: Consumed, epoch: int) -> list[list[tuple]]:
    return [batch for batch_epoch, batch in rank.batches if batch_epoch == epoch]


def _check_exactly_once(jobs: list[list[Consumed]], epoch: int) -> list[list[int]]:
    """G2: over `epoch`, every index is consumed once across `jobs`, plus the padding that the
    last job's ranks reported; each of those ranks yielded the len() it reported. Returns
    that padding (positions, per rank)."""
    indices = Counter(s[0] for ranks in jobs for rank in ranks for batch in _batches(rank, epoch) for s in batch)
    padding = [rank.padding[epoch] for rank in jobs[-1]]
    assert [len(_batches(rank, epoch)) for rank in jobs[-1]] == [rank.lengths[epoch] for rank in jobs[-1]]
    assert indices == Counter(range(LENGTH)) + Counter(_indices(epoch, [p for positions in padding for p in positions]))
    return padding


def _global_steps(jobs: list[list[Consumed]], epoch: int) -> list[list[int]]:
    """The sorted indices of each global step of `epoch` (ranks side by side, padding dropped)."""
    steps = []
    for ranks in jobs:
        per_rank = [_batches(rank, epoch) for rank in ranks]
        assert len({len(batches) for batches in per_rank}) == 1, "ranks consumed different numbers of batches"
        for batches, rank in zip(per_rank, ranks):
            if rank.padding.get(epoch) and len(batches) == rank.lengths[epoch]:  # the final batch
                batches[-1] = batches[-1][: -len(rank.padding[epoch])]
        steps += [sorted(s[0] for batches in per_rank for s in batches[k]) for k in range(len(per_rank[0]))]
    return steps


def _check_planned(out: Path, saved: str, name: str) -> None:
    """Job `name`'s ranks consumed, in epoch 0, the (first `stop`) batches that plan_resume
    computes from the merged states of job `saved`."""
    job = JOBS[name]
    plan = plan_resume(_saved_states(out, saved, range(JOBS[saved].world_size)), job.world_size, job.batch_size)
    for rank, consumed in enumerate(_consumed(out, name)):
        planned = [_indices(0, batch.positions) for batch in plan.batches(rank)]
        stop = len(planned) if job.stop is None else job.stop[rank]
        assert [[s[0] for s in batch] for batch in _batches(consumed, 0)] == planned[:stop]


def _check_values(jobs: list[list[Consumed]]) -> None:
    """G4: every sample's augmentation equals the reference's for its (epoch, index)."""
    values = {(epoch, s[0]): s for epoch, (batch,) in enumerate(_reference(LENGTH)) for s in batch}
    got = [(epoch, s) for ranks in jobs for rank in ranks for epoch, batch in rank.batches for s in batch]
    assert got == [(epoch, values[epoch, s[0]]) for epoch, s in got]


@pytest.mark.slow
@pytest.mark.parametrize(
    "full,stop,resume",
    [
        ("same_full", "same_stop", "same_resume"),
        ("uneven_again_full", "uneven_again", "uneven_again_resume"),
        ("uneven_again_full", "skew_stop", "skew_resume"),
    ],
)
def test_same_world_size_resume_continues_exactly(out: Path, full: str, stop: str, resume: str) -> None:
    """G1: ranks stopped after different counts (the last case: one at the end of epoch 0, one
    in epoch 1, after an elastic resume) load their own entry or every rank's, with other
    num_workers: indices, values (G4), padding and len() as in the uninterrupted run."""
    full_run, stopped, resumed = (_consumed(out, name) for name in (full, stop, resume))
    for rank in range(JOBS[full].world_size):
        assert stopped[rank].batches + resumed[rank].batches == full_run[rank].batches
        assert {**stopped[rank].padding, **resumed[rank].padding} == full_run[rank].padding
        assert {**stopped[rank].lengths, **resumed[rank].lengths} == full_run[rank].lengths
    _check_values([full_run])


@pytest.mark.slow
@pytest.mark.parametrize(
    "names,padding",
    [
        (["same_full"], [[], [0]]),
        (["grow_stop", "grow_resume"], [[], [], [0]]),
        (["one_stop", "one_resume"], [[]]),
    ],
)
def test_global_steps_match_single_process(out: Path, names: list[str], padding: list[list[int]]) -> None:
    """G2, G3, G4 for 2x3 uninterrupted, 2x6 -> 3x4 (0 -> 2 persistent workers, set_epoch
    each epoch) and 4x2 -> 1x8 (0 -> 2 workers): each index once per epoch (plus the
    reported padding), each global step holds the samples of the world-size-1 run's step,
    with the same augmentation values."""
    jobs = [_consumed(out, name) for name in names]
    reference = _reference(JOBS[names[0]].world_size * JOBS[names[0]].batch_size)
    for epoch in range(EPOCHS):
        ran = jobs if epoch == 0 else jobs[-1:]
        assert _check_exactly_once(ran, epoch) == padding
        assert _global_steps(ran, epoch) == [sorted(s[0] for s in step) for step in reference[epoch]]
    _check_values(jobs)


@pytest.mark.slow
def test_elastic_resumes_after_uneven_stops(out: Path) -> None:
    """G2, G4 for 3x2 stopped after 7 (all), 2 and 3 batches -> 2x4 stopped after 1 and 2
    -> 4x1: each resumed job consumes what plan_resume computes from the merged states;
    each index once per epoch, plus the padding the last job reports."""
    names = ["uneven_stop", "uneven_again", "uneven_end"]
    jobs = [_consumed(out, name) for name in names]
    _check_planned(out, "uneven_stop", "uneven_again")
    _check_planned(out, "uneven_again", "uneven_end")
    assert _check_exactly_once(jobs, 0) == [[], [0], [1], [2]]
    assert _check_exactly_once(jobs[2:], 1) == [[], [0], [1], [2]]
    _check_values(jobs)


@pytest.mark.slow
def test_elastic_resume_without_padding(out: Path) -> None:
    """G2, G4 with even_batches=False, 3x2 stopped after 4, 6 and 5 batches -> 2x4: each
    index exactly once per epoch, no padding; in epoch 1 (41 = 5 x 8 + 1) rank 1 gets a
    batch less than rank 0, as its len() said."""
    jobs = [_consumed(out, "no_pad_stop"), _consumed(out, "no_pad_resume")]
    _check_planned(out, "no_pad_stop", "no_pad_resume")
    assert _check_exactly_once(jobs, 0) == [[], []]
    assert _check_exactly_once(jobs[1:], 1) == [[], []]
    assert [rank.lengths[1] for rank in jobs[1]] == [6, 5]
    _check_values(jobs)


@pytest.mark.slow
def test_process_group_subgroup(out: Path) -> None:
    """G1, G4 with process_group= a data-parallel subgroup ({0,2} and {1,3}): a rank shards by
    its rank in the group, saves under that rank's key, and resumes as the loader given that
    rank and world size explicitly runs uninterrupted."""
    stopped, resumed = _consumed(out, "subgroup_stop"), _consumed(out, "subgroup_resume")
    for rank in range(4):
        group_rank = rank // 2
        state = torch.load(out / f"subgroup_stop-state-{rank}.pt")
        assert sorted(key for key in state if key.startswith("rank_")) == [f"rank_{group_rank}"]
        expected = ResumableDataLoader(Augmented(LENGTH), batch_size=3, shuffle=True, seed=SEED, rank=group_rank, world_size=2)
        assert stopped[rank].batches + resumed[rank].batches == [
            (epoch, _samples(batch)) for epoch in range(EPOCHS) for batch in expected
        ]
