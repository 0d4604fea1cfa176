"""G4 for streams: what per-item user code of a ShardedStream draws (its `transform`, its
reader, a Mixture's map-style source next to streams) is seeded from the item's place, so an
item's augmentation is the same at every world size and num_workers, and after any resume."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import numpy
import pytest
import torch

from dist_resume import Mixture, ResumableDataLoader, sample_seed
from dist_resume.randomness.seeds import derive_seed
from dist_resume.streams import JsonlReader, ParquetReader, ShardedStream, WebDatasetReader

from .stream_jobs import SHARD_SIZES, write_shards

GLOBAL_BATCH = 8


def augment(item: int) -> tuple[int, float, float, float]:
    return item, torch.rand(1).item(), random.random(), float(numpy.random.rand())


def noisy_reader(file) -> Any:
    """A reader that draws (which readers should not, but may): its draws are seeded per block."""
    for line in file:
        yield json.loads(line)["id"], torch.randint(0, 2**30, ()).item()


class Drawing(torch.utils.data.Dataset):
    """A map-style source whose samples draw from torch's generator."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[int, float]:
        return 100_000 + index, torch.rand(1).item()


def collate(items: list[Any]) -> list[Any]:
    return items


def draws(make_dataset, world_size: int, num_workers: int, state: dict[str, Any] | None = None,
          steps: int | None = None, **options: Any) -> tuple[list[list[Any]], dict[str, Any]]:
    """The global steps of a job (its ranks in process, one after another; every item with
    what it drew) and the merged state after `steps` global steps."""
    per_rank, merged = [], {}
    for rank in range(world_size):
        loader = ResumableDataLoader(make_dataset(), batch_size=GLOBAL_BATCH // world_size, num_workers=num_workers,
                                     rank=rank, world_size=world_size, collate_fn=collate, seed=5, **options)
        if state is not None:
            loader.load_state_dict(state)
        per_rank.append(list(itertools.islice(loader, steps)))
        merged.update(loader.state_dict())
    return [sum(batches, []) for batches in zip(*per_rank)], merged


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> list[str]:
    return write_shards(str(tmp_path_factory.mktemp("item-seeds")))


def test_a_transforms_draws_are_the_same_at_every_topology_and_after_a_resume(urls):
    def stream():
        return ShardedStream(urls, lambda file: (json.loads(line)["id"] for line in file), window=8, seed=11,
                             canonical_streams=4, transform=augment)

    whole, _ = draws(stream, 1, 0)
    items = [item for step in whole for item in step]
    assert len(items) == 184 and len({item[1:] for item in items}) == 178  # 6 padding items repeat
    assert draws(stream, 2, 2)[0] == whole
    first, state = draws(stream, 2, 1, steps=5)
    rest, _ = draws(stream, 4, 0, state)
    assert first + rest == whole


def test_an_items_seed_is_the_loaders_seed_epoch_and_position(urls):
    """With one canonical stream, position p is the p-th item of the run at one rank."""
    stream = ShardedStream(urls, lambda file: (json.loads(line)["id"] for line in file), window=8, seed=11,
                           canonical_streams=1, transform=lambda item: (item, sample_seed(), torch.rand(1).item()))
    loader = ResumableDataLoader(stream, batch_size=GLOBAL_BATCH, collate_fn=collate, seed=5)
    for epoch in range(2):
        items = [item for batch in loader for item in batch]
        for position, (_, seed, value) in enumerate(items[:20]):
            assert seed == derive_seed(5, epoch, position)
            assert value == torch.rand(1, generator=torch.Generator().manual_seed(seed)).item()


def test_a_readers_draws_are_the_same_at_every_topology(urls):
    def stream():
        return ShardedStream(urls, noisy_reader, window=8, seed=11, canonical_streams=4)

    whole, _ = draws(stream, 1, 0)
    assert draws(stream, 2, 2)[0] == whole
    first, state = draws(stream, 2, 0, steps=3)
    assert first + draws(stream, 1, 1, state)[0] == whole


class Declared:
    """A reader that declares it draws nothing from the global generators (yet does, here:
    so that a seeding would show)."""

    draws_randomness = False

    def __call__(self, file) -> Any:
        for line in file:
            yield json.loads(line)["id"], random.random()


def test_a_reader_that_draws_nothing_is_read_without_seeding(urls):
    """Seeding the generators around a reader that declares it draws nothing would cost
    about 30 us a batch and change nothing: its blocks are read unseeded."""
    stream = ShardedStream(urls, Declared(), shuffle=False, canonical_streams=1, lengths=SHARD_SIZES)
    loader = ResumableDataLoader(stream, batch_size=4, collate_fn=collate, seed=5)
    random.seed(3)
    first = next(iter(loader))
    expected = random.Random(3)
    assert first == [(item, expected.random()) for item, _ in first]  # the caller's generator, drawn on
    assert JsonlReader.draws_randomness is ParquetReader.draws_randomness is WebDatasetReader.draws_randomness is False


def test_a_mixtures_map_style_source_next_to_a_stream_draws_the_same_at_every_topology(urls):
    def mixture():
        stream = ShardedStream(urls, lambda file: (json.loads(line)["id"] for line in file), window=8,
                               seed=11, transform=augment)
        return Mixture({"web": stream, "drawn": Drawing()}, {"web": 3, "drawn": 1}, canonical_streams=4)

    whole, _ = draws(mixture, 1, 0)
    drawn = [item[1] for step in whole for item in step if item[0] >= 100_000]
    assert len(set(drawn)) > 10  # a second source-epoch draws anew
    assert draws(mixture, 2, 2)[0] == whole


def test_the_training_loops_generators_are_its_own_at_num_workers_0(urls):
    def after_three_batches(reader, transform) -> tuple[float, float, float]:
        # lengths given: counting by iterating noisy_reader would draw, unseeded, before the first batch
        stream = ShardedStream(urls, reader, window=8, canonical_streams=2, transform=transform,
                               lengths=SHARD_SIZES)
        loader = ResumableDataLoader(stream, batch_size=4, collate_fn=collate, seed=5)
        torch.manual_seed(3), random.seed(3), numpy.random.seed(3)
        for _ in itertools.islice(loader, 3):
            pass
        return torch.rand(1).item(), random.random(), float(numpy.random.rand())

    # torch's DataLoader draws its workers' base seed from torch's generator at iter(): both do
    assert after_three_batches(noisy_reader, augment) == after_three_batches(JsonlReader(), None)


def test_without_deterministic_transforms_nothing_is_seeded(urls):
    stream = ShardedStream(urls, lambda file: (json.loads(line)["id"] for line in file), window=8,
                           canonical_streams=1, transform=lambda item: (item, torch.rand(1).item()))

    def first_batch(torch_seed: int) -> list[Any]:
        torch.manual_seed(torch_seed)
        loader = ResumableDataLoader(stream, batch_size=2, collate_fn=collate, seed=5, deterministic_transforms=False)
        return next(iter(loader))

    assert first_batch(0) == first_batch(0) != first_batch(1)  # the training loop's generator decides


def test_a_transform_that_is_not_callable_is_refused(urls):
    with pytest.raises(TypeError, match="transform must be callable or None, got int"):
        ShardedStream(urls, noisy_reader, transform=3)


def test_with_in_order_false_an_items_draws_are_the_same_at_every_topology_and_after_a_resume(urls):
    """in_order=False reads the epoch's items one after another: an item's seed is its place
    in that sequence, whichever worker reads it, and after a resume at another layout."""
    def stream():
        return ShardedStream(urls, lambda file: (json.loads(line)["id"] for line in file), window=8, seed=11,
                             canonical_streams=4, transform=lambda item: (item, sample_seed(), torch.rand(1).item()))

    def by_item(steps: list[list[Any]]) -> dict[int, tuple[int, float]]:
        return {item: drawn for step in steps for item, *drawn in step}

    whole, _ = draws(stream, 1, 0, in_order=False)
    seeds = by_item(whole)
    assert len(seeds) == 178
    assert len({seed for seed, _ in seeds.values()}) == 178
    for seed, value in seeds.values():
        assert value == torch.rand(1, generator=torch.Generator().manual_seed(seed)).item()
    assert by_item(draws(stream, 2, 2, in_order=False)[0]) == seeds
    first, state = draws(stream, 2, 1, steps=5, in_order=False)
    rest, _ = draws(stream, 4, 0, state, in_order=False)
    assert by_item(first + rest) == seeds
