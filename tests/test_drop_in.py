"""What a user of torch's DataLoader or torchdata's StatefulDataLoader expects, shown by
their test suites (tests/peer): epochs of stateful iterables, new passes, end-of-epoch
states, set_epoch forwarding, default seeds, worker info, typing (G1, G6)."""

from __future__ import annotations

import gc
import json
import random
import warnings
import weakref

import numpy
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    WeightedRandomSampler,
    get_worker_info,
)

from dist_resume import (
    ResumableDataLoader,
    ResumeStateError,
    state_from_json,
    state_to_json,
)

from .datasets import Squares, flatten
from .test_loader import _resume_after


def values(batches) -> list[int]:
    return [int(v) for batch in batches for v in batch]


class Cursor(IterableDataset):
    """`range(length)` split by worker; its state is a cursor, and a new `__iter__` starts
    from the top unless a state was loaded (as HF's and torchdata's iterables do)."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.resume_at: int | None = None

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        self.position = self.resume_at if self.resume_at is not None else 0  # the cursor exists from here on
        self.resume_at = None
        items = range(worker, self.length, workers)
        while self.position < len(items):
            self.position += 1
            yield items[self.position - 1]

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.resume_at = state["position"]


class LiveState(IterableDataset):
    """Returns its live state dict, as torchdata's PeriodicStateIterableDataset does."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.state = {"next": 0}

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        while self.state["next"] * workers + worker < self.length:
            self.state["next"] += 1
            yield (self.state["next"] - 1) * workers + worker

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_iterable_yields_every_epoch(num_workers):
    loader = ResumableDataLoader(Cursor(40), batch_size=4, num_workers=num_workers)
    assert [len(values(loader)) for _ in range(3)] == [40, 40, 40]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_iterable_resumed_mid_epoch_yields_the_next_epoch_whole(num_workers):
    loader = ResumableDataLoader(Cursor(40), batch_size=4, num_workers=num_workers)
    iterator = iter(loader)
    head = [next(iterator) for _ in range(3)]
    state = loader.state_dict()
    rest = list(iterator)
    resumed = ResumableDataLoader(Cursor(40), batch_size=4, num_workers=num_workers)
    resumed.load_state_dict(state)
    assert values(resumed) == values(rest)
    assert sorted(values(head) + values(rest)) == list(range(40))
    assert sorted(values(resumed)) == list(range(40))


def test_the_constructor_does_not_ask_an_iterable_for_its_state():
    """Cursor has no state before its __iter__ ran (AttributeError), as StatefulDataLoader allows."""
    loader = ResumableDataLoader(Cursor(8), batch_size=4)
    assert values(loader) == list(range(8))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")
@pytest.mark.parametrize("stop", [3, 7])
def test_live_state_dicts_are_snapshotted_when_their_batch_is_made(stop):
    def make():
        return ResumableDataLoader(LiveState(64), batch_size=2, num_workers=4, snapshot_every=1)

    rest, resumed = _resume_after(make, stop)
    assert values(resumed) == values(rest)


class EpochAware(Squares):
    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class EpochAwareSampler(SequentialSampler):
    def __init__(self, data) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_set_epoch_reaches_the_dataset_and_the_sampler():
    dataset = EpochAware(6)
    sampler = EpochAwareSampler(range(6))
    loader = ResumableDataLoader(dataset, batch_size=3, sampler=sampler)
    loader.set_epoch(3)
    assert dataset.epochs[-1] == 3 and sampler.epochs[-1] == 3
    list(loader)
    list(loader)  # the automatic advance
    assert dataset.epochs[-1] == 4 and sampler.epochs[-1] == 4


def test_set_epoch_reaches_a_batch_sampler():
    class EpochBatches(BatchSampler):
        epoch = None

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    batch_sampler = EpochBatches(SequentialSampler(range(6)), batch_size=2, drop_last=False)
    loader = ResumableDataLoader(Squares(6), batch_sampler=batch_sampler)
    loader.set_epoch(2)
    assert batch_sampler.epoch == 2


def _order(**kwargs) -> list[int]:
    return flatten(ResumableDataLoader(Squares(30), batch_size=5, shuffle=True, **kwargs))


def test_the_default_seed_follows_torch_manual_seed_and_generator():
    torch.manual_seed(1)
    first = _order()
    torch.manual_seed(1)
    assert _order() == first
    torch.manual_seed(2)
    assert _order() != first
    assert _order(generator=torch.Generator().manual_seed(7)) == _order(generator=torch.Generator().manual_seed(7))
    assert _order(generator=torch.Generator().manual_seed(7)) != _order(generator=torch.Generator().manual_seed(8))


def test_the_default_seed_is_recorded_and_adopted_on_resume():
    torch.manual_seed(3)
    loader = ResumableDataLoader(Squares(30), batch_size=5, shuffle=True)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    rest = flatten(iterator)
    torch.manual_seed(4)
    resumed = ResumableDataLoader(Squares(30), batch_size=5, shuffle=True)
    resumed.load_state_dict(state)
    assert resumed.seed == loader.seed and flatten(resumed) == rest
    chosen = ResumableDataLoader(Squares(30), batch_size=5, shuffle=True, seed=loader.seed + 1)
    with pytest.raises(ResumeStateError, match="^loader state was saved with seed "):
        chosen.load_state_dict(state)


def test_ranks_share_the_default_seed_without_a_generator():
    torch.manual_seed(5)
    a = ResumableDataLoader(Squares(30), batch_size=5, shuffle=True, rank=0, world_size=2)
    torch.manual_seed(6)
    b = ResumableDataLoader(Squares(30), batch_size=5, shuffle=True, rank=1, world_size=2)
    assert a.seed == b.seed == 0
    assert sorted(flatten(a) + flatten(b)) == list(range(30))


def test_the_loader_is_generic_like_torchs():
    loader: ResumableDataLoader[int] = ResumableDataLoader[int](Squares(4), batch_size=2)
    assert flatten(loader) == [0, 1, 2, 3]


def test_a_dataset_that_grows_between_epochs_is_read_whole():
    data = [torch.tensor([i]) for i in range(4)]
    loader = ResumableDataLoader(data, batch_size=2, shuffle=True, seed=0)
    list(loader)
    data.append(torch.tensor([4]))
    assert len(loader) == 3
    assert sorted(int(v) for batch in loader for v in batch) == [0, 1, 2, 3, 4]


class WorkerSees(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        return int(type(get_worker_info().dataset) is WorkerSees)


def test_get_worker_info_dataset_is_the_users_dataset():
    assert values(ResumableDataLoader(WorkerSees(), batch_size=2, num_workers=2)) == [1, 1, 1, 1]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_states_round_trip_through_json(num_workers):
    def make():
        return ResumableDataLoader(Cursor(30), batch_size=4, num_workers=num_workers, snapshot_every=1)

    loader = make()
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = loader.state_dict()
    text = json.dumps(json.loads(state_to_json(state)))
    rest = values(iterator)
    restored = state_from_json(text)
    assert _same_state(restored, state)
    resumed = make()
    resumed.load_state_dict(restored)
    assert values(resumed) == rest


def _same_state(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same_state(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def test_json_keeps_dtypes_shapes_tuples_and_other_keys():
    state = {"a": torch.zeros((2, 0, 3), dtype=torch.int64), "b": torch.tensor([1, 255], dtype=torch.uint8),
             "c": {1: (2.5, None, "x")}, "__tensor__": [True]}
    assert _same_state(state_from_json(state_to_json(state)), state)
    with pytest.raises(TypeError, match=r"^loader state value at state\['s'\] is a set, which has no JSON form$"):
        state_to_json({"s": {1}})


@pytest.mark.parametrize("seeded", [False, True], ids=["global_generator", "own_generator"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_random_sampler_without_state_resumes_on_the_same_samples(seeded, num_workers):
    def make():
        generator = torch.Generator().manual_seed(8) if seeded else None
        sampler = WeightedRandomSampler([1.0] * 20, num_samples=20, replacement=True, generator=generator)
        return ResumableDataLoader(Squares(20), batch_size=4, sampler=sampler, num_workers=num_workers, seed=0)

    torch.manual_seed(0)
    loader = make()
    list(loader)  # epoch 0
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    rest = flatten(iterator)
    following = flatten(loader)
    torch.manual_seed(99)
    resumed = make()
    resumed.load_state_dict(state)
    assert flatten(resumed) == rest
    if seeded:
        assert flatten(resumed) == following  # the sampler's generator went on as uninterrupted


@pytest.mark.slow
def test_persistent_workers_end_with_their_loader():
    loader = ResumableDataLoader(Squares(8), batch_size=2, num_workers=2, persistent_workers=True)
    list(loader)
    list(loader)
    workers = list(loader._inner._iterator._workers)
    assert all(worker.is_alive() for worker in workers)
    freed = weakref.ref(loader)
    gc.disable()  # freed by reference counting alone: no cycle holds the loader
    try:
        del loader
        assert freed() is None
        assert not any(worker.is_alive() for worker in workers)
    finally:
        gc.enable()


@pytest.mark.slow
@pytest.mark.parametrize("sampling", ["epoch order", "user sampler", "user batch sampler"])
def test_persistent_workers_end_with_an_iterator_dropped_midway(sampling):
    """torch's test_partial_workers: only the iterator is held, it is dropped after a few
    batches of many, and the workers exit with it (no cycle through the request generator)."""
    dataset = Squares(64)
    options = {"epoch order": {"batch_size": 2},
               "user sampler": {"batch_size": 2, "sampler": SequentialSampler(dataset)},
               "user batch sampler": {"batch_sampler": BatchSampler(SequentialSampler(dataset), 2, False)}}[sampling]
    iterator = iter(ResumableDataLoader(dataset, num_workers=2, persistent_workers=True, **options))
    workers = list(iterator._workers)
    for _ in range(3):
        next(iterator)
    gc.disable()
    try:
        del iterator
        for worker in workers:
            worker.join(10)
        assert not any(worker.is_alive() for worker in workers)
    finally:
        gc.enable()


class InitSeeds(Dataset):
    """Each sample: the seeds its worker's worker_init_fn saw."""

    seen = (-1, -1)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[int, int]:
        return self.seen


def _record_init_seeds(worker_id: int) -> None:
    info = get_worker_info()
    info.dataset.seen = (torch.initial_seed(), info.seed)


@pytest.mark.slow
def test_worker_seeds_follow_the_generator_as_under_torch():
    def seeds(loader_class, generator_seed: int) -> set:
        generator = torch.Generator().manual_seed(generator_seed)
        loader = loader_class(InitSeeds(), batch_size=1, num_workers=2, generator=generator,
                              worker_init_fn=_record_init_seeds)
        return {(int(a), int(b)) for a, b in loader}

    torchs = seeds(DataLoader, 42)
    assert seeds(ResumableDataLoader, 42) == torchs and len(torchs) == 2
    assert seeds(ResumableDataLoader, 43) != torchs


class EpochCounting(IterableDataset):
    """Counts its finished passes in its state (torchdata's GeneratorIterable): a state
    taken between epochs carries the count to a resumed loader."""

    def __init__(self, length: int) -> None:
        self.length, self.passes, self.resume_at = length, 0, None

    def __iter__(self):
        start, self.resume_at = self.resume_at or 0, None
        for self.position in range(start, self.length):
            yield (self.passes, self.position)
        self.passes += 1

    def state_dict(self) -> dict:
        return {"passes": self.passes}

    def load_state_dict(self, state: dict) -> None:
        self.passes = state["passes"]


def test_a_state_between_epochs_carries_an_in_process_iterables_state():
    loader = ResumableDataLoader(EpochCounting(4), batch_size=None)
    list(loader)
    state = loader.state_dict()
    expected = list(loader)
    resumed = ResumableDataLoader(EpochCounting(4), batch_size=None)
    next(iter(resumed))  # a loader that had already started
    resumed.load_state_dict(state)
    assert [tuple(map(int, item)) for item in resumed] == [tuple(map(int, item)) for item in expected] == [(1, i) for i in range(4)]


class SelfIterator(IterableDataset):
    """`__iter__` returns itself and creates the state that `load_state_dict` sets
    (torchdata's CountIterCallsIter): its state is loaded after `iter()`."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        self.items = list(range(worker, self.length, workers))
        self.position = 0
        return self

    def __next__(self) -> int:
        if self.position >= len(self.items):
            raise StopIteration
        self.position += 1
        return self.items[self.position - 1]

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterable_that_is_its_own_stateful_iterator_resumes_exactly(num_workers):
    def make():
        return ResumableDataLoader(SelfIterator(40), batch_size=3, num_workers=num_workers, snapshot_every=2)

    rest, resumed = _resume_after(make, 5)
    assert values(resumed) == values(rest) and len(values(rest)) == 40 - 15


@pytest.mark.slow
def test_workers_of_an_abandoned_iterator_end_with_it():
    iterator = iter(ResumableDataLoader(Squares(40), batch_size=2, num_workers=2))
    next(iterator)
    workers = list(iterator._workers)
    assert len(workers) == 2 and all(worker.is_alive() for worker in workers)
    del iterator
    assert not any(worker.is_alive() for worker in workers)


def test_iterable_items_are_never_compared():
    class Arrays(IterableDataset):
        def __iter__(self):
            return iter([numpy.arange(3) + i for i in range(4)])

    assert [batch.tolist() for batch in ResumableDataLoader(Arrays(), batch_size=None)] == [[i, i + 1, i + 2] for i in range(4)]


class SelfIterating(IterableDataset):
    """An iterable that is its own iterator, with its cursor as its state (torchdata's
    DummyIteratorIterableDataset): `iter()` does not rewind it."""

    def __init__(self, length: int) -> None:
        self.length, self.cursor = length, 0

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.cursor >= self.length:
            raise StopIteration
        self.cursor += 1
        return self.cursor - 1

    def state_dict(self) -> dict:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.cursor = state["cursor"]


def test_a_state_taken_after_iter_holds_the_in_process_iterables_state():
    """G1 at num_workers=0: a state taken after `iter()` and before the first batch resumes
    where the dataset stood then, even after the dataset (the same object) ran on."""
    dataset = SelfIterating(10)
    loader = ResumableDataLoader(dataset, batch_size=3)
    iterator = iter(loader)
    state = loader.state_dict()
    expected = [batch.tolist() for batch in iterator]
    assert dataset.cursor == 10
    resumed = ResumableDataLoader(dataset, batch_size=3)
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == expected == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


class DrawingIterator(SelfIterating):
    """A stateful iterator that draws from torch's global generator and keeps that
    generator's state in its own (torchdata's DummyIterator)."""

    def __next__(self) -> int:
        super().__next__()
        return int(torch.randint(1000, (1,)))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        torch.set_rng_state(state["rng"])


class DrawingStream(IterableDataset):
    def __iter__(self):
        return DrawingIterator(12)


def test_a_state_taken_after_iter_holds_the_in_process_iterators_state():
    """The same with a stateful iterator: its state (here holding the generator it draws
    from) is taken when the loader's state is, so the resume draws what the run drew."""
    torch.manual_seed(0)
    loader = ResumableDataLoader(DrawingStream(), batch_size=4, seed=0)
    iterator = iter(loader)
    state = loader.state_dict()
    expected = [batch.tolist() for batch in iterator]
    resumed = ResumableDataLoader(DrawingStream(), batch_size=4, seed=0)
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == expected and len(expected) == 3


def test_a_state_taken_before_iter_resumes_a_new_dataset_from_its_start():
    """Before the first `iter()` the loader does not ask the dataset for its state (it may
    have none yet): the resume iterates the dataset afresh, as in a new process."""
    loader = ResumableDataLoader(SelfIterating(10), batch_size=3)
    state = loader.state_dict()
    expected = [batch.tolist() for batch in loader]
    resumed = ResumableDataLoader(SelfIterating(10), batch_size=3)
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == expected


class Numbers(IterableDataset):
    def __iter__(self):
        return iter(range(8))


@pytest.mark.parametrize("seed", [0, 123])
def test_an_iterable_at_num_workers_0_leaves_the_callers_generators_alone(seed):
    """The training loop's draws between batches are those under torch's DataLoader: the
    loader does not reseed the process's generators for a stream read in process (with a
    given seed; without one, the loader draws its seed from torch's generator first)."""
    def draws(make) -> list[float]:
        out = []
        for global_seed in (1, 2):
            torch.manual_seed(global_seed)
            random.seed(global_seed)
            numpy.random.seed(global_seed)
            for _ in make():
                out.append((torch.rand(()).item(), random.random(), float(numpy.random.rand())))
        return out

    theirs = draws(lambda: DataLoader(Numbers(), batch_size=4))
    ours = draws(lambda: ResumableDataLoader(Numbers(), batch_size=4, seed=seed))
    assert ours == theirs
    assert theirs[:2] != theirs[2:]


class Counting(IterableDataset):
    """Every worker yields the whole range (a stream that is not split across workers)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self):
        return iter(range(self.length))

    def __len__(self) -> int:
        return self.length


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_that_yields_past_its_reported_length_warns_as_under_torch(num_workers):
    """torch's NOTE [ IterableDataset and __len__ ]: after len(loader) was read, each batch
    past that length warns (here, with workers, each replica yields the whole stream)."""
    loader = ResumableDataLoader(Counting(6), batch_size=None, num_workers=num_workers)
    assert len(list(loader)) == 6 * max(num_workers, 1)  # no warning before len() is read
    assert len(loader) == 6
    iterator = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        head = [next(iterator) for _ in range(6)]
    if num_workers == 0:
        assert head == list(range(6)) and list(iterator) == []
        return
    with pytest.warns(UserWarning) as caught:
        next(iterator)
    (warning,) = caught
    assert str(warning.message) == (
        "Length of IterableDataset " + str(loader.dataset) + " was reported to be 6 (when accessing "
        "len(dataloader)), but 7 samples have been fetched. For multiprocessing data-loading, this could be "
        "caused by not properly configuring the IterableDataset replica at each worker. Please see "
        "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples.")


class Drawing(Dataset):
    """Sample i: (i, a draw from torch's global generator), as a random augmentation."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, int(torch.randint(1000, (1,)))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_loaded_into_a_started_loader_draws_what_a_fresh_loader_draws(num_workers):
    """G1 with the default seed (drawn, then adopted from the state): a loader that had
    already fetched batches under its own drawn seed fetches, after the load, exactly what
    a fresh loader given the same state fetches (torchdata's test_load_then_state)."""
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(Drawing(), batch_size=4, num_workers=num_workers, persistent_workers=num_workers > 0)

    state = make().state_dict()
    fresh = make()
    fresh.load_state_dict(state)
    expected = [(indices.tolist(), draws.tolist()) for indices, draws in fresh]
    started = make()
    iterator = iter(started)
    for _ in range(3):
        next(iterator)
    started.load_state_dict(state)
    assert started.seed == fresh.seed
    assert [(indices.tolist(), draws.tolist()) for indices, draws in started] == expected
    assert sorted(index for indices, _ in expected for index in indices) == list(range(24))
