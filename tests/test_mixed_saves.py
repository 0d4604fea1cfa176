"""Entries of different saves are refused, not resumed (issue 23 point 2; G6 "nothing
silently ignored"). Every rank entry records the global step its loader stood at; entries of
one load at different steps (a rank that stopped between a training step and the save) raise
one ResumeStateError naming each rank's step, whatever path loads them: plain
load_state_dict of merged states, load_checkpoint, Lightning and accelerate (test_accelerate)."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import ResumableDataLoader, ResumeStateError, load_checkpoint, save_checkpoint
from dist_resume.integrations.lightning import LightningLoader
from dist_resume.state.fields import FIELDS, FIRST_FIELDS, PROGRESS_KEY
from tests.merged_states import merged

MIXED = (
    "loader state entries come from different saves ({listed}): a rank stopped between a training step and the "
    "save, or states of different saves were merged; resume from a checkpoint that every rank saved at one step "
    "(if the ranks do not train in lockstep, load with independent_ranks=True)"
)


def _job(world_size: int, length: int = 20, batch_size: int = 2, even_batches: bool = True) -> list[ResumableDataLoader]:
    return [ResumableDataLoader(list(range(length)), batch_size=batch_size, shuffle=True, seed=3, rank=rank,
                                world_size=world_size, even_batches=even_batches) for rank in range(world_size)]


def _lockstep(loaders: list[ResumableDataLoader], steps: int) -> list[dict]:
    """Every rank's state after ``steps`` global steps of a lockstep loop over epochs (a rank
    whose pass is over sits the epoch's last step out), taken at the same moment."""
    iterators: list = [iter(loader) for loader in loaders]
    taken = 0
    while taken < steps:
        batches = [None if iterator is None else next(iterator, None) for iterator in iterators]
        iterators = [None if batch is None else iterator for iterator, batch in zip(iterators, batches)]
        if any(batch is not None for batch in batches):
            taken += 1
        else:
            iterators = [iter(loader) for loader in loaders]
    return [loader.state_dict() for loader in loaders]


def test_entries_of_two_saves_are_refused_by_load_state_dict():
    at_three = _lockstep(_job(2), 3)
    at_two = _lockstep(_job(2), 2)
    mixed = merged(at_three[0], at_two[1])
    for loader in _job(2) + _job(3):
        listed = "ranks [0] at global step 3; ranks [1] at global step 2"
        with pytest.raises(ResumeStateError, match=f"^{re.escape(MIXED.format(listed=listed))}$"):
            loader.load_state_dict(mixed)
    # the same entries, from one save, resume
    _job(3)[0].load_state_dict(merged(*at_three))


def test_independent_ranks_resume_where_each_stopped():
    """Ranks that do not train in lockstep opt in: the remaining positions are re-planned (G2)."""
    first = _job(2)
    mixed = merged(_lockstep(first[:1], 3)[0], _lockstep(first[1:], 1)[0])
    served = []
    for loader in _job(1, batch_size=4):
        loader.load_state_dict(mixed, independent_ranks=True)
        served += [index for batch in loader for index in batch.tolist()]
    assert len(served) == 20 - 2 * 3 - 2 * 1 and len(set(served)) == len(served)


def test_entries_of_two_saves_are_refused_by_load_checkpoint(tmp_path):
    """DCP writes one save's entries; merged states of two steps saved together are refused
    at load, at the same and at another world size."""
    mixed = merged(_lockstep(_job(2), 4)[0], _lockstep(_job(2), 1)[1])
    save_checkpoint({"loader": mixed}, str(tmp_path), 4)
    message = MIXED.format(listed="ranks [0] at global step 4; ranks [1] at global step 1")
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"loader": _job(1)[0]}, str(tmp_path))


def test_entries_of_two_saves_are_refused_under_lightning():
    mixed = merged(_lockstep(_job(2), 2)[0], _lockstep(_job(2), 1)[1])
    message = MIXED.format(listed="ranks [0] at global step 2; ranks [1] at global step 1")
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        LightningLoader(_job(1, batch_size=4)[0]).load_state_dict(mixed)


def test_an_entry_without_a_step_beside_one_with_a_step_is_refused():
    """States saved before the step was recorded load as they did (tests/test_previous_layout);
    such an entry merged with a newer one cannot be of the same save."""
    states = _lockstep(_job(2), 2)
    old = states[1]["rank_1"][PROGRESS_KEY][:FIRST_FIELDS].clone()
    states[1]["rank_1"][PROGRESS_KEY] = old
    listed = "ranks [0] at global step 2; ranks [1] at an unrecorded global step (saved by an older dist_resume)"
    with pytest.raises(ResumeStateError, match=f"^{re.escape(MIXED.format(listed=listed))}$"):
        _job(2)[0].load_state_dict(merged(*states))
    states[0]["rank_0"][PROGRESS_KEY] = states[0]["rank_0"][PROGRESS_KEY][:FIRST_FIELDS].clone()
    _job(3)[0].load_state_dict(merged(*states))  # an old save: loads, unchecked


def _step(state: dict, rank: int) -> int:
    return int(state[f"rank_{rank}"][PROGRESS_KEY][-1])


@settings(max_examples=150, deadline=None)
@given(length=st.integers(1, 30), world_size=st.integers(1, 4), batch_size=st.integers(1, 3),
       even_batches=st.booleans(), steps=st.integers(0, 25), behind=st.integers(0, 3))
def test_lockstep_saves_load_and_a_rank_behind_is_refused(length, world_size, batch_size, even_batches, steps, behind):
    """Ranks stepping together (at an epoch's end with even_batches=False, a rank with a batch
    less sits the last step out) all record the step: one save, which loads; a rank's entry
    taken one step earlier is refused, unless that rank had consumed its whole epoch then."""
    def job():
        return _job(world_size, length, batch_size, even_batches)

    states = _lockstep(job(), steps)
    assert [_step(state, rank) for rank, state in enumerate(states)] == [steps] * world_size
    job()[0].load_state_dict(merged(*states))
    if steps == 0 or world_size == 1:
        return
    rank = behind % world_size
    earlier = _lockstep(job(), steps - 1)[rank]
    if int(earlier[f"rank_{rank}"][PROGRESS_KEY][FIELDS.index("epoch_finished")]):
        return  # a rank that consumed its whole epoch stands at its end, whatever step its peers are at
    with pytest.raises(ResumeStateError, match="^loader state entries come from different saves"):
        job()[0].load_state_dict(merged(*states[:rank], earlier, *states[rank + 1:]))


def test_with_a_custom_sampler_ranks_compare_their_batch_of_the_epoch():
    """A custom sampler's ranks may get different numbers of batches, which the loader cannot
    know: ranks into an epoch must stand at the same batch of it; a rank whose pass already
    ended (at the next epoch's start) may be behind."""
    shares = [range(0, 10, 2), range(1, 14, 2)]  # 5 samples (3 batches) for rank 0, 7 (4) for rank 1

    def job() -> list[ResumableDataLoader]:
        with pytest.warns(UserWarning, match="with a custom sampler the loader does not shard"):
            return [ResumableDataLoader(list(range(14)), batch_size=2, rank=rank, world_size=2,
                                        sampler=torch.utils.data.SubsetRandomSampler(
                                            shares[rank], generator=torch.Generator().manual_seed(rank)))
                    for rank in (0, 1)]

    ahead, behind = job(), job()
    iterators = [iter(loader) for loader in ahead]
    for _ in range(3):
        for iterator in iterators:
            next(iterator)
    next(iter(behind[1]))
    listed = "ranks [0] at batch 3 of epoch 0; ranks [1] at batch 1 of epoch 0"
    with pytest.raises(ResumeStateError, match=f"^{re.escape(MIXED.format(listed=listed))}$"):
        job()[0].load_state_dict(merged(ahead[0].state_dict(), behind[1].state_dict()))
    assert next(iterators[0], None) is None  # rank 0's pass ended: it stands at epoch 1's start
    job()[0].load_state_dict(merged(ahead[0].state_dict(), ahead[1].state_dict()))  # one save


def test_ranks_that_consumed_their_whole_epoch_are_one_save_before_their_pass_ends():
    """even_batches=False, 20 samples, 2 ranks x 3: rank 0 has 4 batches, rank 1 three. Both
    took every batch, neither pass has ended: rank 1 sits the last step out, so it is at the
    epoch's end at step 3 or 4. Taken one step earlier, rank 0 is not: refused."""
    def job() -> list[ResumableDataLoader]:
        return [ResumableDataLoader(list(range(20)), batch_size=3, seed=1, rank=rank, world_size=2,
                                    even_batches=False) for rank in range(2)]

    def taken(batches: tuple[int, int]) -> list[dict]:
        loaders = job()
        for loader, count in zip(loaders, batches):
            iterator = iter(loader)
            for _ in range(count):
                next(iterator)
        return [loader.state_dict() for loader in loaders]

    for loader in job():
        loader.load_state_dict(merged(*taken((4, 3))))
        loader.load_state_dict(merged(*taken((3, 3))))
    listed = "ranks [1] at global step 3; ranks [0] at global step 2"
    with pytest.raises(ResumeStateError, match=f"^{re.escape(MIXED.format(listed=listed))}$"):
        job()[0].load_state_dict(merged(*taken((2, 3))))
