"""G2 over committed steps for replica groups that join, leave and fail to commit, without a
fault-tolerance framework: the arithmetic of `ReplicaSteps` and `ResumableDataLoader.regroup`
(hypothesis), and its state as a restart's (G1-G3). torchft itself runs in tests/test_torchft.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dist_resume import Mixture, ResumableDataLoader, ResumeStateError
from dist_resume.loader.replica_steps import ReplicaSteps


def _loader(length: int, batch_size: int, rank: int, world_size: int, **options) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(length)), batch_size=batch_size, shuffle=True, seed=3, rank=rank,
                               world_size=world_size, **options)


def _order(length: int, epoch: int) -> list[int]:
    loader = _loader(length, 1, 0, 1)
    loader.set_epoch(epoch)
    return [int(batch) for batch in loader]


@dataclass
class Group:
    """The ranks of one replica group (each its loader and steps)."""

    ranks: list[ReplicaSteps]
    served: list[list[int]] = field(default_factory=list)  # this step's batch of each rank


class Job:
    """Replica groups of `ranks` ranks over a dataset of `length`, driven step by step."""

    def __init__(self, length: int, batch_size: int, ranks: int, dataset=None, **options) -> None:
        self.length, self.batch_size, self.ranks = length, batch_size, ranks
        self.dataset, self.options = dataset, options
        self.groups: dict[int, Group] = {}
        self.trained: dict[int, list[int]] = {}  # epoch -> the committed steps' samples, in order

    def start(self, group: int, source: int | None) -> None:
        """A new life of `group`: fresh, or healed from group `source` (its state handed over)."""
        ranks = []
        for rank in range(self.ranks):
            loader = ResumableDataLoader(self.dataset or list(range(self.length)), batch_size=self.batch_size,
                                         shuffle=True, seed=3, rank=rank, world_size=self.ranks, **self.options)
            if source is not None:
                loader.load_state_dict(self.groups[source].ranks[rank].loader.state_dict())
            ranks.append(ReplicaSteps(loader))
        self.groups[group] = Group(ranks)

    def step(self, participants: list[int], committed: bool, healing: dict[int, int]) -> None:
        """One step: `participants` (in participating-rank order) train, the other groups serve
        as spares; `healing` groups (not participants) take a participant's state before it
        settles, as torchft's asynchronous healing does."""
        states = {group: [steps.loader.state_dict() for steps in self.groups[source].ranks]
                  for group, source in healing.items()}
        epoch = next(iter(self.groups.values())).ranks[0].epoch
        for number, group in self.groups.items():
            rank = participants.index(number) if number in participants else None
            group.served = [steps.serve(len(participants), rank).tolist() for steps in group.ranks]
        for group, state in states.items():
            for steps, rank_state in zip(self.groups[group].ranks, state):
                steps.loader.load_state_dict(rank_state)
                steps.loaded()
        if committed:
            parts = [self.groups[number].served for number in participants]
            self.trained.setdefault(epoch, []).extend(chain.from_iterable(chain.from_iterable(parts)))
        for group in self.groups.values():
            for steps in group.ranks:
                steps.settle(committed)
                if steps.epoch_ended:
                    steps.begin_epoch()
        epochs = {steps.epoch for group in self.groups.values() for steps in group.ranks}
        assert len(epochs) == 1, f"the groups disagree on the epoch: {epochs}"

    @property
    def epoch(self) -> int:
        return next(iter(self.groups.values())).ranks[0].epoch


@st.composite
def _events(draw):
    """A run: per step, the alive groups' changes, the participants among them, the outcome."""
    groups = draw(st.integers(1, 4))
    mostly = st.sampled_from([True, True, True, False])
    return groups, draw(st.lists(st.tuples(st.integers(0, 3), mostly.map(lambda x: not x), st.integers(0, 15),
                                           mostly, st.booleans()), min_size=1, max_size=60))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(length=st.integers(1, 24), batch_size=st.integers(1, 3), ranks=st.integers(1, 2), run=_events())
def test_g2_the_committed_steps_partition_each_epoch_in_its_order(length, batch_size, ranks, run):
    """For any sequence of (participants, committed or not) per step, with groups killed,
    joining healed from a peer before their step or during it (a spare step), the committed
    steps' positions, in step order and each by participating rank, are the epoch's order
    from its first position to its last, then fewer than a step's ranks of padding (G2)."""
    count, events = run
    job = Job(length, batch_size, ranks)
    for group in range(count):
        job.start(group, None)
    for group, leave, chosen, commit, in_step in events:
        if job.epoch >= 2:
            break
        alive = sorted(job.groups)
        healing = {}
        if leave and len(alive) > 1 and group in job.groups:
            del job.groups[group]  # killed: the step it was in does not commit
            commit = False
        elif group not in job.groups:
            source = alive[0]
            if in_step:  # heals during its first step, as a spare
                job.start(group, None)
                healing[group] = source
            else:
                job.start(group, source)
        alive = sorted(job.groups)
        participants = [g for i, g in enumerate(alive) if chosen >> i & 1 and g not in healing] or [
            g for g in alive if g not in healing][:1]
        job.step(participants, commit, healing)
    event(f"epochs finished: {job.epoch}")
    for epoch, trained in job.trained.items():
        order = _order(length, epoch)
        finished = epoch < job.epoch
        if finished:
            assert trained[:length] == order
            padding = trained[length:]
            assert padding == [order[i % length] for i in range(len(padding))] and len(padding) < 4 * ranks
        else:
            assert trained == order[: len(trained)]


def test_a_state_taken_between_steps_resumes_as_a_restart_at_another_world_size():
    """The same plan as a restart (G1-G3): three groups of one rank commit steps of 3 x 2,
    one step is not committed and the next has two groups; the state of a group then resumes
    in plain ResumableDataLoaders at world size 4 on exactly the positions no committed step
    took, split as a job of 4 ranks splits them."""
    length = 30
    job = Job(length, 2, 1)
    for group in range(3):
        job.start(group, None)
    job.step([0, 1, 2], True, {})
    job.step([0, 1, 2], False, {})
    job.step([0, 2], True, {})
    trained = job.trained[0]
    state = job.groups[2].ranks[0].loader.state_dict()
    resumed = [_loader(length, 2, rank, 4) for rank in range(4)]
    for loader in resumed:
        loader.load_state_dict(state)
    order = _order(length, 0)
    assert trained == order[:10]
    batches = [[batch.tolist() for batch in loader] for loader in resumed]
    rest = order[10:]
    expected = [[rest[8 * step + 2 * rank: 8 * step + 2 * rank + 2] for step in range(3)] for rank in range(4)]
    # the final step pads its 4 ranks' blocks of ceil(4 / 4) = 1 sample
    for rank in range(4):
        expected[rank][2] = rest[16 + rank: 17 + rank]
    assert batches == expected


def test_a_peer_with_another_seed_is_refused_and_changes_nothing():
    """G6 in a hand-off: a state of another seed is refused with the loader's error, and the
    group keeps its position."""
    ours = ReplicaSteps(_loader(12, 2, 0, 1))
    other = ResumableDataLoader(list(range(12)), batch_size=2, shuffle=True, seed=4, rank=0, world_size=1)
    before = ours.loader.state_dict()
    with pytest.raises(ResumeStateError, match="saved with seed 4; this loader has seed 3"):
        ours.loader.load_state_dict(other.state_dict())
    assert torch.equal(ours.loader.state_dict()["rank_0"]["progress"], before["rank_0"]["progress"])


@pytest.mark.parametrize("options, refused", [
    ({"drop_last": True}, "needs drop_last=False, even_batches=True"),
    ({"even_batches": False}, "needs drop_last=False, even_batches=True"),
    ({"in_order": False, "num_workers": 1}, "this loader has in_order=False"),
])
def test_loaders_it_cannot_serve_are_refused(options, refused):
    with pytest.raises(ValueError, match=refused):
        ReplicaSteps(_loader(12, 2, 0, 1, **options))


def _stream_of(dataset, epoch: int) -> list[int]:
    loader = ResumableDataLoader(dataset, batch_size=1, shuffle=True, seed=3, rank=0, world_size=1)
    loader.set_epoch(epoch)
    return [int(batch) for batch in loader]


def _churn(job: Job) -> None:
    """Two groups; a step that does not commit; g0 leaving between steps, so that g1, which
    served the second part of each step, serves the first; g0 back, healing during a step."""
    job.start(0, None)
    job.start(1, None)
    job.step([0, 1], True, {})
    job.step([0, 1], False, {})
    job.step([0, 1], True, {})
    job.step([0, 1], True, {})
    del job.groups[0]
    job.step([1], True, {})
    job.start(0, None)
    job.step([1], True, {0: 1})
    while job.epoch < 1:
        job.step([0, 1], True, {})


def test_a_mixture_is_served_in_its_own_order_over_committed_steps():
    """A Mixture of map-style sources (it decides its own order): the committed steps of
    changing groups read the samples an uninterrupted loader reads, in its order."""
    mixture = Mixture({"a": torch.arange(0, 60), "b": torch.arange(100, 140)},
                      weights=[(0, {"a": 0.6, "b": 0.4})], length=30)
    job = Job(30, 2, 1, dataset=mixture)
    _churn(job)
    expected = _stream_of(mixture, 0)
    assert job.trained[0][:30] == expected and job.trained[0][30:] == expected[: len(job.trained[0]) - 30]


def test_batches_the_workers_prefetched_for_another_quorum_are_never_trained():
    """With 2 workers prefetching 4 batches each pass, the quorum changes and a step that does
    not commit drop what they fetched: the committed steps still read the epoch's order once."""
    job = Job(40, 2, 1, num_workers=2, prefetch_factor=2, persistent_workers=True)
    _churn(job)
    assert job.trained[0] == _order(40, 0)
