"""`skip` with in_order=False on a ShardedStream and on a Mixture of streams: each rank passes
over its next batches of the pass (at a pass's start, after a load, or when its batches so
far are a prefix of its own), read past and never transformed; the skipped items are never
trained, also after a resume at another world size (G2), and the skipped range is recorded
the same on every rank."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import re
from collections import Counter
from typing import Any

import pytest

from dist_resume import Mixture, ResumableDataLoader
from dist_resume.streams import ShardedStream

from .merged_states import merged_from
from .stream_jobs import all_items, read_jsonl, write_shards
from .stream_mixture_jobs import LENGTH, STAGES, write_sources
from .unordered_datasets import GatedReader, RecordingTransform, recorded
from .test_unordered_streams import even_shards


def _stream(urls: list[str], path: str) -> ShardedStream:
    return ShardedStream(urls, read_jsonl, window=8, seed=11, transform=RecordingTransform(path))


def _loaders(dataset: Any, world_size: int, num_workers: int, state: dict[str, Any] | None,
             batch_size: int) -> list[ResumableDataLoader]:
    loaders = []
    for rank in range(world_size):
        loader = ResumableDataLoader(dataset, batch_size=batch_size, num_workers=num_workers, rank=rank,
                                     world_size=world_size, in_order=False, even_batches=False, seed=3)
        if state is not None:
            loader.load_state_dict(state)
        loaders.append(loader)
    return loaders


def _take(loaders: list[ResumableDataLoader], steps: int | None) -> list[int]:
    items = [item for loader in loaders for batch in itertools.islice(loader, steps) for item in batch.tolist()]
    gc.collect()  # the workers of abandoned iterators stop reading
    return items


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_skip_reads_nothing_it_passes_over_and_survives_a_resume_at_another_world_size(tmp_path, num_workers):
    urls = write_shards(str(tmp_path))
    reads = str(tmp_path / "reads.txt")
    stream = _stream(urls, reads)
    loaders = _loaders(stream, 2, num_workers, None, 3)
    trained = _take(loaders, 2)
    if num_workers:  # workers' batches arrive in any order: skip after a load at the same layout
        state = merged_from(loaders)
        del loaders
        gc.collect()
        loaders = _loaders(stream, 2, num_workers, state, 3)
    (tmp_path / "reads.txt").unlink(missing_ok=True)  # what was read from here on
    assert [loader.skip(3) for loader in loaders] == [3, 3]
    assert len({tuple(loader.skipped) for loader in loaders}) == 1
    trained += _take(loaders, 1)
    state = merged_from(loaders)
    del loaders
    gc.collect()
    resumed = _loaders(stream, 3, 1, state, 2)
    (skipped_range,) = resumed[0].skipped
    assert (skipped_range.first_batch, skipped_range.stop_batch, skipped_range.batches) == (2, 5, 3)
    assert skipped_range.positions == 18
    trained += _take(resumed, None)
    counts = Counter(trained)
    assert set(counts.values()) == {1}
    skipped = set(all_items()) - set(counts)
    assert len(skipped) == 18 and set(trained) | skipped == set(all_items())
    assert skipped.isdisjoint(recorded(reads))  # read past, never taken
    assert set(trained) - set(recorded(reads)) <= set(trained[:12])  # the rest was read after the skip


def test_a_mixture_of_streams_skips_with_in_order_false(tmp_path):
    urls = write_sources(str(tmp_path))
    reads = str(tmp_path / "reads.txt")

    def mixture() -> Mixture:
        return Mixture({"web": _stream(urls["web"], reads), "code": _stream(urls["code"], reads)}, STAGES, LENGTH)

    whole = _take(_loaders(mixture(), 1, 0, None, 12), None)
    (tmp_path / "reads.txt").unlink()
    loaders = _loaders(mixture(), 2, 0, None, 6)
    trained = _take(loaders, 1)
    assert [loader.skip(2) for loader in loaders] == [2, 2]
    trained += _take(_loaders(mixture(), 3, 1, merged_from(loaders), 4), None)
    skipped = Counter(whole) - Counter(trained)
    assert sum(skipped.values()) == 24 and Counter(trained) + skipped == Counter(whole)
    assert not set(skipped) & set(recorded(reads)) - set(trained)


def test_a_skip_while_batches_are_in_flight_beyond_the_prefix_is_refused(tmp_path):
    gate = multiprocessing.Event()
    # shuffle off, window 1: worker role 0 reads batches 0-3, whose first item waits for the gate
    stream = ShardedStream(even_shards(tmp_path), GatedReader({0}, gate), shuffle=False, window=1, lengths=[8] * 4)
    (loader,) = _loaders(stream, 1, 2, None, 4)
    iterator = iter(loader)
    assert next(iterator).tolist() == [2000, 2001, 2002, 2003]
    message = ("skip() cannot pass over batches while this pass delivered some out of order (in_order=False) beyond "
               "its consumed prefix (batches 0, 1, 2, 3 are still in flight): skip between passes, or after "
               "load_state_dict / load_checkpoint")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        loader.skip(1)
    gate.set()
    del iterator
