"""`in_order=False`: batches numbered on their way through the workers, so that the main
process knows which batch of the epoch each one is, whichever worker finished first."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any, NamedTuple

from torch.utils.data import Dataset, IterableDataset

from dist_resume.loader.fetch import BatchRequest, SeededDataset
from dist_resume.loader.progress import Progress
from dist_resume.positions.layout import Layout
from dist_resume.state.delivered import Delivered
from dist_resume.state.fields import Sampling


def check_unordered(dataset: Dataset, sampling: Sampling, stateful_dataset: bool) -> None:
    """One clear error for what `in_order=False` does not resume exactly (yet)."""
    supported = ("in_order=False is supported for map-style datasets and Mixtures in the loader's own order, and "
                 "for IterableDatasets and Mixtures of streams")
    if isinstance(dataset, IterableDataset) or sampling is Sampling.STREAM:
        return  # each worker's batches come in its own order: recorded per worker role
    if sampling is not Sampling.EPOCH_ORDER:
        raise ValueError(f"{supported}; this loader has a custom sampler or batch_sampler: use in_order=True")
    if stateful_dataset:
        raise ValueError(f"{supported}; this dataset has state_dict/load_state_dict (per-worker states need "
                         "in_order=True)")


class NumberedRequest(NamedTuple):
    """A batch request with the number of its batch in the rank's epoch."""

    number: int
    request: BatchRequest

    def wire(self) -> tuple:
        """As a worker receives it (see `BatchRequest.wire`)."""
        return self.number, self.request.wire()


def numbered(requests: Iterator[BatchRequest], first_batch: int) -> Iterator[NumberedRequest]:
    """The requests of batches `first_batch, first_batch + 1, ...`, each with its number."""
    for number, request in enumerate(requests, start=first_batch):
        yield NumberedRequest(number, request)


class Numbered(NamedTuple):
    number: int
    samples: Any


class NumberedDataset(SeededDataset):
    """`SeededDataset` answering a numbered request with its samples and the number."""

    def __getitems__(self, numbered_request: NumberedRequest | tuple) -> Numbered:  # type: ignore[override]
        number, request = numbered_request
        return Numbered(number, super().__getitems__(request))


class NumberingCollate:
    """collate of a numbered batch: `(number, collate_fn(samples))`."""

    def __init__(self, collate_fn) -> None:
        self.collate_fn = collate_fn

    def __call__(self, numbered_samples: Numbered) -> tuple[int, Any]:
        return numbered_samples.number, self.collate_fn(numbered_samples.samples)


def arrivals(batches: Iterator[Any], numbers: collections.deque[int]) -> Iterator[Any]:
    """The batches without their numbers, each number queued as its batch is handed on."""
    for number, batch in batches:
        numbers.append(number)
        yield batch


def deliver(progress: Progress, number: int, layout: Layout, rank: int) -> None:
    """Batch `number` of `progress`'s epoch reached the training loop: the prefix, its
    samples and the delivered-beyond set follow (G1 for in_order=False)."""
    delivered = progress.delivered
    if delivered is None:
        delivered = progress.delivered = Delivered(progress.batches)
    delivered.deliver(number)
    if delivered.prefix != progress.batches:
        progress.batches = delivered.prefix
        progress.samples = layout.slots_before(rank, delivered.prefix)
    progress.finished = progress.batches == layout.num_batches(rank)
