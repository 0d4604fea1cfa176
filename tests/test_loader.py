"""ResumableDataLoader in one process: drop-in behaviour, exact resume (G1), per-sample
randomness (G4), small state and no replay (G5), clear refusals (G6)."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    Sampler,
    SequentialSampler,
)

from dist_resume import ResumableDataLoader, ResumeStateError
from dist_resume.positions.epoch_order import EpochOrder
from dist_resume.state.fields import FIELDS

from .datasets import Augmented, BatchedFetch, Fetches, Squares, flatten
from .merged_states import merged


def assert_same(a, b) -> None:
    """Nested equality of batches (tensors compared exactly, dtype included)."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def assert_same_batches(left, right) -> None:
    left, right = list(left), list(right)
    assert len(left) == len(right)
    for a, b in zip(left, right):
        assert_same(a, b)


def pairs_collate(samples):
    return [index for index, _ in samples], torch.cat([square for _, square in samples])


class EveryThird(Sampler[int]):
    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        return iter(range(0, self.length, 3))

    def __len__(self) -> int:
        return len(range(0, self.length, 3))


# -- drop-in ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=4),
        dict(batch_size=4, drop_last=True),
        dict(batch_size=None),
        dict(batch_size=3, sampler=EveryThird(23)),
        dict(batch_sampler=BatchSampler(SequentialSampler(range(23)), batch_size=6, drop_last=False)),
        dict(batch_size=4, num_workers=2),
        dict(batch_size=4, num_workers=2, persistent_workers=True, prefetch_factor=3),
    ],
    ids=["plain", "drop_last", "no_batching", "sampler", "batch_sampler", "workers", "persistent"],
)
@pytest.mark.parametrize("as_dict", [False, True], ids=["tuple", "dict"])
def test_same_batches_as_torch_dataloader(kwargs, as_dict):
    dataset = Squares(23, as_dict=as_dict)
    assert_same_batches(DataLoader(dataset, **kwargs), ResumableDataLoader(dataset, **kwargs))


def test_same_batches_with_a_custom_collate_fn():
    dataset = Squares(23)
    assert_same_batches(
        DataLoader(dataset, batch_size=5, collate_fn=pairs_collate),
        ResumableDataLoader(dataset, batch_size=5, collate_fn=pairs_collate),
    )


def test_same_batches_with_pin_memory():
    dataset = Squares(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no accelerator here: torch warns and does not pin
        expected = list(DataLoader(dataset, batch_size=3, pin_memory=True))
        actual = list(ResumableDataLoader(dataset, batch_size=3, pin_memory=True))
    assert_same_batches(expected, actual)


def test_spawned_workers_get_the_wrapped_dataset_by_pickle():
    """The "spawn" start method pickles the dataset wrapper into each worker."""
    kwargs = dict(batch_size=4, num_workers=2, multiprocessing_context="spawn", shuffle=True, seed=3)
    expected = ResumableDataLoader(Augmented(12), batch_size=4, shuffle=True, seed=3)
    assert_same_batches(expected, ResumableDataLoader(Augmented(12), **kwargs))


def test_len_and_loader_attributes_stay_torchs():
    dataset = Squares(23)
    loader = ResumableDataLoader(dataset, batch_size=4, drop_last=True)
    assert len(loader) == len(DataLoader(dataset, batch_size=4, drop_last=True)) == 5
    assert loader.dataset is dataset and loader.batch_size == 4 and loader.drop_last
    assert isinstance(loader, DataLoader)


def test_datasets_with_getitems_fetch_whole_batches():
    batches = list(ResumableDataLoader(BatchedFetch(10), batch_size=4, seed=0))
    assert flatten(batches) == list(range(10))
    # one draw per batch, seeded from the batch's first position: reproducible
    again = list(ResumableDataLoader(BatchedFetch(10), batch_size=4, seed=0))
    assert_same_batches(batches, again)


def test_shuffled_epochs_follow_the_seeded_epoch_order():
    loader = ResumableDataLoader(Squares(50), batch_size=8, shuffle=True, seed=5)
    for epoch in range(3):
        assert flatten(loader) == EpochOrder(50, 5, epoch, shuffle=True).indices(torch.arange(50))


# -- G1: exact resume -------------------------------------------------------------


def _resume_after(make, batches: int, **resume_kwargs):
    """Consumes `batches` batches, saves, and returns (the uninterrupted rest, the resumed rest)."""
    loader = make()
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    state = loader.state_dict()
    rest = list(iterator)
    resumed = make(**resume_kwargs)
    resumed.load_state_dict(state)
    return rest, list(resumed)


@pytest.mark.parametrize("stop", range(0, 8))
def test_g1_resume_after_any_batch(stop):
    def make(**kwargs):
        return ResumableDataLoader(Augmented(29), batch_size=4, shuffle=True, seed=3, **kwargs)

    rest, resumed = _resume_after(make, stop)
    assert_same_batches(rest, resumed)


@pytest.mark.parametrize(
    "before, after",
    [
        (dict(num_workers=2), dict(num_workers=2)),
        (dict(num_workers=0), dict(num_workers=2, prefetch_factor=4)),
        (dict(num_workers=2, persistent_workers=True), dict(num_workers=0)),
        (dict(num_workers=2, prefetch_factor=1), dict(num_workers=2, pin_memory=True)),
    ],
)
def test_g1_resume_with_other_workers_prefetch_or_pinning(before, after):
    """Workers prefetch ahead; only yielded batches count, whatever the settings."""

    def make(**kwargs):
        return ResumableDataLoader(Augmented(41), batch_size=3, shuffle=True, seed=1, **(kwargs or before))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator
        rest, resumed = _resume_after(make, 5, **after)
    assert_same_batches(rest, resumed)


def test_resume_with_another_batch_size_continues_on_the_next_sample():
    loader = ResumableDataLoader(Squares(50), batch_size=4, shuffle=True, seed=2)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(5)]
    resumed = ResumableDataLoader(Squares(50), batch_size=7, shuffle=True, seed=2)
    resumed.load_state_dict(loader.state_dict())
    tail = list(resumed)
    assert all(len(batch[0]) == 7 for batch in tail[:-1])
    assert flatten(head) + flatten(tail) == EpochOrder(50, 2, 0, shuffle=True).indices(torch.arange(50))


def test_resume_at_an_epoch_boundary_matches_stateful_dataloader():
    """A state taken after the epoch's last batch but before its iterator ended resumes
    into no batches; one taken after it ended resumes at the next epoch (torchdata's
    StatefulDataLoader, pytorch#166732)."""
    loader = ResumableDataLoader(Squares(10), batch_size=4, shuffle=True)
    iterator = iter(loader)
    first = [next(iterator) for _ in range(3)]
    inside = loader.state_dict()
    assert list(iterator) == []
    after = loader.state_dict()
    second = flatten(loader)
    resumed = ResumableDataLoader(Squares(10), batch_size=4, shuffle=True)
    resumed.load_state_dict(inside)
    assert resumed.epoch == 0
    assert list(resumed) == []
    assert resumed.epoch == 1
    assert flatten(resumed) == second != flatten(first)
    resumed = ResumableDataLoader(Squares(10), batch_size=4, shuffle=True)
    resumed.load_state_dict(after)
    assert resumed.epoch == 1 and flatten(resumed) == second


def test_loaded_state_takes_effect_at_the_next_iter_and_stale_iterators_stop():
    loader = ResumableDataLoader(Squares(20), batch_size=2)
    iterator = iter(loader)
    next(iterator)
    saved = loader.state_dict()
    next(iterator)
    next(iterator)
    loader.load_state_dict(saved)
    with pytest.raises(RuntimeError, match=re.escape("this ResumableDataLoader iterator is stale")):
        next(iterator)
    assert flatten(loader) == list(range(2, 20))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_new_iter_is_a_new_pass_so_a_peeked_batch_is_trained(num_workers):
    """As torch's DataLoader and StatefulDataLoader: a new iter() without a loaded state
    starts a fresh pass (the next epoch once the current one yielded a batch)."""
    loader = ResumableDataLoader(Squares(12), batch_size=3, num_workers=num_workers, shuffle=True, seed=5)
    peeked = next(iter(loader))
    assert loader.epoch == 0
    assert flatten(loader) == EpochOrder(12, 5, 1, shuffle=True).indices(torch.arange(12))
    assert flatten([peeked]) == EpochOrder(12, 5, 0, shuffle=True).indices(torch.arange(3))
    iterator = iter(loader)  # nothing consumed from it: the next pass serves the same epoch
    assert loader.epoch == 2
    del iterator
    assert flatten(loader) == EpochOrder(12, 5, 2, shuffle=True).indices(torch.arange(12))


# -- G4: per-sample randomness ----------------------------------------------------


def _augmentations(batches) -> dict[int, tuple]:
    values = {}
    for batch in batches:
        for i, index in enumerate(batch["index"].tolist()):
            values[index] = (batch["torch"][i].item(), batch["random"][i].item(), batch["numpy"][i].item())
    return values


def test_g4_augmentation_depends_only_on_seed_epoch_position():
    reference = _augmentations(ResumableDataLoader(Augmented(30), batch_size=4, shuffle=True, seed=9))
    other = _augmentations(ResumableDataLoader(Augmented(30), batch_size=7, shuffle=True, seed=9, num_workers=2))
    assert reference == other
    halves = [ResumableDataLoader(Augmented(30), batch_size=5, shuffle=True, seed=9, rank=r, world_size=2) for r in (0, 1)]
    assert {**_augmentations(halves[0]), **_augmentations(halves[1])} == reference
    assert len({value for values in reference.values() for value in values}) == 90  # all different


def test_g4_next_epoch_and_other_seed_draw_other_augmentations():
    loader = ResumableDataLoader(Augmented(10), batch_size=5, seed=1)
    first, second = _augmentations(loader), _augmentations(loader)
    assert first.keys() == second.keys() and all(first[i] != second[i] for i in first)
    assert _augmentations(ResumableDataLoader(Augmented(10), batch_size=5, seed=2)) != first


def test_deterministic_transforms_off_leaves_the_generators_alone():
    torch.manual_seed(0)
    a = _augmentations(ResumableDataLoader(Augmented(6), batch_size=3, deterministic_transforms=False))
    torch.manual_seed(1)
    b = _augmentations(ResumableDataLoader(Augmented(6), batch_size=3, deterministic_transforms=False))
    assert [v[0] for v in a.values()] != [v[0] for v in b.values()]


# -- G5: small state, no replay ----------------------------------------------------


def test_g5_resume_fetches_only_what_is_left():
    loader = ResumableDataLoader(Fetches(1000), batch_size=10, shuffle=True, seed=0)
    iterator = iter(loader)
    for _ in range(90):
        next(iterator)
    dataset = Fetches(1000)
    resumed = ResumableDataLoader(dataset, batch_size=10, shuffle=True)
    resumed.load_state_dict(loader.state_dict())
    list(resumed)
    assert dataset.fetched == EpochOrder(1000, 0, 0, shuffle=True).indices(torch.arange(900, 1000))


@pytest.mark.parametrize("length", [1_000, 10_000_000])
def test_g5_state_is_a_handful_of_integers(length):
    class Sized(torch.utils.data.Dataset):
        def __len__(self):
            return length

        def __getitem__(self, index):
            return index

    loader = ResumableDataLoader(Sized(), batch_size=64, shuffle=True)
    iterator = iter(loader)
    next(iterator)
    tensors = [loader.state_dict()["plan"], loader.state_dict()["rank_0"]["progress"]]
    assert sum(t.numel() * t.element_size() for t in tensors) == len(FIELDS) * 8  # the RankState fields
    assert all(t.dtype == torch.int64 for t in tensors)


# -- epochs -------------------------------------------------------------------------


def test_epochs_advance_by_themselves_and_set_epoch_chooses():
    loader = ResumableDataLoader(Squares(8), batch_size=4, shuffle=True, seed=0)
    orders = [flatten(loader) for _ in range(3)]
    assert orders == [EpochOrder(8, 0, e, shuffle=True).indices(torch.arange(8)) for e in range(3)]
    loader.set_epoch(7)
    assert loader.epoch == 7 and flatten(loader) == EpochOrder(8, 0, 7, shuffle=True).indices(torch.arange(8))


def test_set_epoch_of_the_epoch_in_progress_restarts_it_saying_so():
    loader = ResumableDataLoader(Squares(12), batch_size=3)
    next(iter(loader))
    with pytest.warns(UserWarning, match=re.escape(
            "set_epoch(0) restarts epoch 0 after 1 batches, as DistributedSampler.set_epoch does; "
            "they are served again")):
        loader.set_epoch(0)
    assert flatten(loader) == list(range(12))


def test_set_epoch_of_a_loaded_epoch_keeps_its_position():
    loader = ResumableDataLoader(Squares(12), batch_size=3)
    next(iter(loader))
    resumed = ResumableDataLoader(Squares(12), batch_size=3)
    resumed.load_state_dict(loader.state_dict())
    resumed.set_epoch(0)
    assert flatten(resumed) == list(range(3, 12))


def test_set_epoch_warns_when_it_abandons_and_keeps_a_loaded_position():
    loader = ResumableDataLoader(Squares(12), batch_size=3)
    next(iter(loader))
    with pytest.warns(UserWarning, match=re.escape("set_epoch(1) abandons epoch 0 after 1 batches")):
        loader.set_epoch(1)
    iterator = iter(loader)
    while len(loader) - loader.state_dict()["rank_0"]["progress"][FIELDS.index("batches_consumed")]:
        next(iterator)
    resumed = ResumableDataLoader(Squares(12), batch_size=3)
    resumed.load_state_dict(loader.state_dict())
    resumed.set_epoch(1)  # the loaded position: the end of epoch 1
    assert list(resumed) == []
    assert resumed.epoch == 2
    loader.set_epoch(1)  # not resumed: a fresh pass of epoch 1, as DistributedSampler.set_epoch
    assert flatten(loader) == list(range(12))


def test_distributed_sampler_gets_its_epoch():
    sampler = DistributedSampler(Squares(10), num_replicas=2, rank=1, shuffle=True, seed=4)
    loader = ResumableDataLoader(Squares(10), batch_size=2, sampler=sampler, seed=4)
    reference = DistributedSampler(Squares(10), num_replicas=2, rank=1, shuffle=True, seed=4)
    for epoch in range(2):
        reference.set_epoch(epoch)
        assert flatten(loader) == list(reference)


# -- custom samplers --------------------------------------------------------------


class CountingSampler(Sampler[int]):
    """A stateful sampler in the style of torchdata's tutorial: random draws, its own epoch."""

    def __init__(self, high: int, count: int) -> None:
        self.high, self.count, self.epoch = high, count, 0

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.epoch)
        self.epoch += 1
        for _ in range(self.count):
            yield int(torch.randint(self.high, (), generator=generator))

    def __len__(self) -> int:
        return self.count

    def state_dict(self) -> dict:
        return {"epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        self.epoch = state["epoch"]


@pytest.mark.parametrize("sampler_kind", ["stateful", "plain"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_samplers_resume_exactly(sampler_kind, num_workers):
    def make():
        sampler = CountingSampler(40, 25) if sampler_kind == "stateful" else EveryThird(40)
        return ResumableDataLoader(Squares(40), batch_size=4, sampler=sampler, num_workers=num_workers)

    loader = make()
    list(loader)  # a whole epoch first: the stateful sampler moves on to its next epoch
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    state = loader.state_dict()
    rest = list(iterator) + list(loader)
    resumed = make()
    resumed.load_state_dict(state)
    assert_same_batches(rest, list(resumed) + list(resumed))


def test_custom_sampler_resumes_with_another_batch_size_and_no_batching():
    loader = ResumableDataLoader(Squares(40), batch_size=4, sampler=EveryThird(40))
    iterator = iter(loader)
    head = [next(iterator) for _ in range(2)]
    resumed = ResumableDataLoader(Squares(40), batch_size=None, sampler=EveryThird(40))
    resumed.load_state_dict(loader.state_dict())
    assert len(resumed) == 14
    tail = [index for index, _ in resumed]
    assert flatten(head) + tail == list(range(0, 40, 3))


def test_custom_batch_sampler_resumes_by_batches():
    def make():
        return ResumableDataLoader(Squares(30), batch_sampler=BatchSampler(SequentialSampler(range(30)), 7, False))

    rest, resumed = _resume_after(make, 2)
    assert_same_batches(rest, resumed)


def test_custom_sampler_cannot_resume_at_another_world_size():
    loader = ResumableDataLoader(Squares(10), batch_size=2, sampler=EveryThird(10), rank=0, world_size=1)
    with pytest.warns(UserWarning, match="with a custom sampler the loader does not shard over ranks"):
        other = ResumableDataLoader(Squares(10), batch_size=2, sampler=EveryThird(10), rank=0, world_size=2)
    message = (
        "loader state was saved at world size 1 with a custom sampler or batch_sampler; resuming at world size 2 "
        "needs the loader's own sampling (a custom sampler's indices cannot be re-partitioned over ranks)"
    )
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        other.load_state_dict(loader.state_dict())


# -- sharding and padding (G2 within one job) ------------------------------------


def test_explicit_ranks_partition_the_epoch_and_report_their_padding():
    loaders = [ResumableDataLoader(Squares(10), batch_size=2, shuffle=True, rank=r, world_size=3) for r in range(3)]
    per_rank = [flatten(loader) for loader in loaders]
    order = EpochOrder(10, 0, 0, shuffle=True).indices(torch.arange(10))
    # steps of 6: [0, 6) in blocks of 2; the last 4 positions split in blocks of 2, padded by 2 from the start
    assert [len(indices) for indices in per_rank] == [4, 4, 4]
    assert per_rank[0] == [order[p] for p in (0, 1, 6, 7)]
    assert per_rank[1] == [order[p] for p in (2, 3, 8, 9)]
    assert per_rank[2] == [order[p] for p in (4, 5, 0, 1)]
    assert [loader.padding_positions(0) for loader in loaders] == [[], [], [0, 1]]


# -- G6: clear refusals ------------------------------------------------------------


def _state(**kwargs) -> dict:
    loader = ResumableDataLoader(Squares(kwargs.pop("length", 20)), batch_size=4, **kwargs)
    next(iter(loader))
    return loader.state_dict()


@pytest.mark.parametrize(
    "saved, loader_kwargs, message",
    [
        (dict(length=21), dict(), "loader state was saved for a dataset of 21 samples; this loader's dataset has 20"),
        (dict(seed=1), dict(seed=0), "loader state was saved with seed 1; this loader has seed 0"),
        (dict(shuffle=True), dict(), "loader state was saved with shuffle=True; this loader has shuffle=False"),
        (
            dict(drop_last=True),
            dict(),
            "loader state was saved with drop_last=True, even_batches=True; this loader has drop_last=False, even_batches=True",
        ),
        (
            dict(sampler=EveryThird(20)),
            dict(),
            "loader state was saved with sampling by a custom sampler; this loader samples by the loader's own epoch order",
        ),
    ],
)
def test_g6_state_of_another_loader_is_refused(saved, loader_kwargs, message):
    loader = ResumableDataLoader(Squares(20), batch_size=4, **loader_kwargs)
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        loader.load_state_dict(_state(**saved))


def _edited(**fields: int) -> dict:
    state = _state()
    for field, value in fields.items():
        state["rank_0"]["progress"][FIELDS.index(field)] = value
    return state


@pytest.mark.parametrize(
    "state, message",
    [
        (lambda: _edited(version=7), "loader state entry 'rank_0' has format version 7; this dist_resume reads version 1"),
        (
            lambda: _edited(batches_consumed=9, samples_consumed=36),
            "loader state of rank 0 is impossible: 9 batches consumed of an epoch that has 5",
        ),
        (
            lambda: _edited(batches_consumed=9),
            "loader state of rank 0 is impossible: 9 batches but 4 samples consumed",
        ),
        (
            lambda: _edited(samples_consumed=5),
            "loader state of rank 0 is impossible: 1 batches hold 4 samples, the state says 5",
        ),
        (lambda: _edited(rank=3), "loader state entry 'rank_0' says it belongs to rank 3"),
        (
            lambda: _edited(global_batch=5),
            "loader state of rank 0 is impossible: global batch 5 != 1 x 4",
        ),
        (lambda: {"plan": torch.zeros(0, dtype=torch.int64)}, "loader state has no rank entries (expected keys like 'rank_0')"),
        (lambda: {**_state(), "rank_x": {}}, "loader state has a malformed rank key 'rank_x': a rank entry is named "
                                             "'rank_<r>', r written in ASCII digits without leading zeros, below 1048576"),
        (
            lambda: {**_state(), "plan": torch.tensor([0, 1, 0, 0, 0])},
            "loader state's 'plan' does not match the digest rank 0 recorded (entries from different saves mixed?)",
        ),
    ],
    ids=["version", "batches", "counts", "samples", "rank", "global_batch", "no_ranks", "bad_key", "plan_mismatch"],
)
def test_g6_broken_states_are_refused(state, message):
    loader = ResumableDataLoader(Squares(20), batch_size=4)
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        loader.load_state_dict(state())


def test_g6_elastic_resume_needs_every_rank():
    loader = ResumableDataLoader(Squares(20), batch_size=2, rank=1, world_size=2)
    next(iter(loader))
    resumed = ResumableDataLoader(Squares(20), batch_size=2, rank=0, world_size=3)
    message = (
        "loader state holds ranks [1] of a world of 2, ranks [0] are missing: resuming at world size 3, "
        "batch size 2 (saved: world size 2, batch size 2) needs every rank's state "
        "(use dist_resume.load_checkpoint, or merge the state_dict() of every rank)"
    )
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        resumed.load_state_dict(loader.state_dict())


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(rank=0), ValueError, "give both rank and world_size, or neither (got rank=0, world_size=None)"),
        (dict(rank=2, world_size=2), ValueError, "rank must be in [0, world_size), got rank=2, world_size=2"),
        (dict(seed=-1), ValueError, "seed must be in [0, 2**63), got -1"),
    ],
)
def test_bad_arguments_are_refused(kwargs, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        ResumableDataLoader(Squares(4), **kwargs)


def test_worker_init_fn_reaches_the_users_dataset():
    def init(worker_id):
        torch.utils.data.get_worker_info().dataset.offset = 100

    class Offset(Squares):
        offset = 0

        def __getitem__(self, index):
            return index + self.offset

    values = [int(v) for batch in ResumableDataLoader(Offset(6), batch_size=2, num_workers=2, worker_init_fn=init) for v in batch]
    assert values == list(range(100, 106))


def test_merged_states_of_ranks_in_different_epochs_resume_after_an_elastic_plan():
    """The elastic plan is fixed for a job's life: a rank already in the next epoch saves
    the same replicated plan as a peer still finishing the planned epoch, so any merge of
    their states resumes both exactly (ranks not in lockstep: independent_ranks)."""

    def make(rank, world_size, batch_size):
        return ResumableDataLoader(Squares(23), batch_size=batch_size, shuffle=True, rank=rank, world_size=world_size)

    first = [make(r, 3, 2) for r in range(3)]
    saved = {}
    for loader, stop in zip(first, (1, 2, 2)):  # an uneven stop: the next job has a plan
        iterator = iter(loader)
        for _ in range(stop):
            next(iterator)
        saved.update(loader.state_dict())
    job = [make(r, 2, 4) for r in range(2)]
    for loader in job:
        loader.load_state_dict(saved, independent_ranks=True)
    behind = iter(job[0])
    for _ in range(len(job[0]) - 1):
        next(behind)
    list(job[1])
    ahead = iter(job[1])  # rank 1 is now in epoch 1
    next(ahead)
    states = [job[0].state_dict(), job[1].state_dict()]
    expected = [list(behind), list(ahead) + list(job[1])]
    for order in ((0, 1), (1, 0)):
        state = merged(*(states[rank] for rank in order))
        resumed = [make(r, 2, 4) for r in range(2)]
        for loader in resumed:
            loader.load_state_dict(state, independent_ranks=True)
        assert_same_batches(expected[0], list(resumed[0]))
        assert_same_batches(expected[1], list(resumed[1]) + list(resumed[1]))
