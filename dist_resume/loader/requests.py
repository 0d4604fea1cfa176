"""The batch requests a `ResumableDataLoader` sends its inner DataLoader: which positions
and dataset indices each batch of the current pass holds, from its own epoch order or a
user's sampler, starting at the consumed position."""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy
import torch

from dist_resume.loader.dataset_states import DatasetStates
from dist_resume.loader.fetch import BatchRequest
from dist_resume.loader.unordered import numbered
from dist_resume.positions.dataset_order import position_order
from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.rank_batches import rank_positions
from dist_resume.positions.layout import Layout
from dist_resume.state.fields import Sampling

# Positions mapped to indices per vectorized call: large enough that the per-call
# cost of tensor operations vanishes, small enough that the first batch is quick.
_POSITIONS_PER_CHUNK = 16384


class RequestSampler:
    """The batch sampler of the inner DataLoader: each `iter()` asks the loader for the
    requests of its current position, so persistent workers follow resumes. It holds the
    loader's methods weakly: the loader owns the inner DataLoader, and a cycle would keep
    persistent workers alive after the loader is dropped."""

    def __init__(self, requests: weakref.WeakMethod, length: weakref.WeakMethod,
                 wire: Callable[[Any], tuple] | None) -> None:
        self._requests = requests
        self._length = length
        self._wire = wire  # how a request travels to a worker; None: no workers

    def __iter__(self) -> Iterator[Any]:
        requests = self._live(self._requests)()
        return map(self._wire, requests) if self._wire is not None else requests

    def __len__(self) -> int:
        return self._live(self._length)()

    @staticmethod
    def _live(method: weakref.WeakMethod) -> Callable:
        bound = method()
        if bound is None:
            raise RuntimeError("the ResumableDataLoader of this sampler was deleted")
        return bound


class BatchRequests:
    """The request generation of `ResumableDataLoader` (a mixin: it reads the loader's position)."""

    def _requests(self) -> Iterator[Any]:
        # Read the position now: the generator body only runs when the first batch is drawn.
        progress = self._progress
        start = (progress.batches, progress.samples)
        if self._sampling is Sampling.EPOCH_ORDER:
            requests = self._epoch_order_requests(progress.epoch, progress.plan, start[0])
        else:
            requests = self._user_sampler_requests(progress.epoch, *start)
        if not self.in_order:
            return numbered(requests, start[0])
        return recording_sizes(requests, self._sizes, start[0], self._dataset_states)

    def _epoch_order_requests(self, epoch: int, plan: Plan, first_batch: int) -> Iterator[BatchRequest]:
        layout = Layout(plan.length, self.world_size, self._rank_batch_size, self._mode)
        order = position_order(self.dataset, self._dataset_length, self.seed, epoch, self.shuffle)
        return epoch_order_requests(epoch, plan, layout, self.rank, order, first_batch)

    def _user_sampler_requests(self, epoch: int, first_batch: int, first_sample: int) -> Iterator[BatchRequest]:
        sampler = self._user_sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        stateful = callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None))
        if stateful:
            if self._sampler_snapshot is None:
                self._sampler_snapshot = sampler.state_dict()
            else:
                sampler.load_state_dict(self._sampler_snapshot)
        elif self._sampler_rng.applies:
            sampler = self._sampler_rng.iterate(sampler)
        if self._sampling is Sampling.BATCH_SAMPLER:
            return batch_sampler_requests(sampler, epoch, first_batch)
        return sampler_requests(sampler, epoch, first_sample, self._rank_batch_size, self.drop_last)


# The request generators hold no reference to the loader: the inner DataLoader's persistent
# iterator keeps its batch sampler's generator, and a loader held from there would outlive
# its last user with its workers running.


def epoch_order_requests(epoch: int, plan: Plan, layout: Layout, rank: int, order, first_batch: int
                         ) -> Iterator[BatchRequest]:
    """The requests of `rank`'s batches from `first_batch` on, in the loader's epoch order."""
    total = layout.num_batches(rank)
    per_chunk = max(1, _POSITIONS_PER_CHUNK // layout.batch_size)
    for first in range(first_batch, total, per_chunk):
        positions, sizes = rank_positions(plan, layout, rank, first, min(total, first + per_chunk))
        indices = order.indices(positions)
        starts, consecutive = consecutive_batches(positions, sizes)
        # A batch of consecutive positions (all but padded or remapped ones) is a range: no
        # list built, and a worker receives only its first position (BatchRequest.wire).
        listed = None if all(consecutive) else positions.tolist()
        offset = 0
        for size, start, in_order in zip(sizes, starts, consecutive):
            batch_positions = range(start, start + size) if in_order else listed[offset : offset + size]
            yield BatchRequest(epoch, batch_positions, indices[offset : offset + size])
            offset += size


def batch_sampler_requests(batch_sampler, epoch: int, first_batch: int) -> Iterator[BatchRequest]:
    """A user batch sampler's batches from `first_batch` on. Resume replays the sampler's
    indices (no data is fetched): a sampler's stream cannot be entered in the middle."""
    position = 0
    for index, batch in enumerate(batch_sampler):
        indices = list(batch)
        if index >= first_batch:
            yield BatchRequest(epoch, range(position, position + len(indices)), indices)
        position += len(indices)


def sampler_requests(sampler, epoch: int, first_sample: int, batch_size: int, drop_last: bool) -> Iterator[BatchRequest]:
    """A user sampler's indices from `first_sample` on, in batches (replayed as above)."""
    position = 0
    pending: list[int] = []
    for index in sampler:
        if position >= first_sample:
            pending.append(index)
            if len(pending) == batch_size:
                yield BatchRequest(epoch, range(position - len(pending) + 1, position + 1), pending)
                pending = []
        position += 1
    if pending and not drop_last:
        yield BatchRequest(epoch, range(position - len(pending), position), pending)


def recording_sizes(
    requests: Iterator[BatchRequest], sizes: collections.deque[int], first_batch: int, states: DatasetStates | None
) -> Iterator[BatchRequest]:
    # Batches come back in request order (in_order=True), so the sizes queue tells the
    # size of each batch as it is yielded.
    for sent, request in enumerate(requests):
        sizes.append(len(request.indices))
        if states is not None:
            # Request `sent` goes to worker `sent % roles`: its first one restores its role's state.
            role = states.role(first_batch + sent)
            request = request._replace(role=role, restore=states.restore(role) if sent < states.roles else None)
        yield request


def consecutive_batches(positions: torch.Tensor, sizes: list[int]) -> tuple[list[int], list[bool]]:
    """For batches of `sizes` laid end to end in `positions`: each one's first position, and
    whether its positions are consecutive."""
    if not sizes:
        return [], []
    # numpy: a chunk's few operations cost a fraction of torch's fixed cost per operation.
    values = positions.numpy()
    counts = numpy.array(sizes, dtype=numpy.int64)
    offsets = counts.cumsum() - counts
    breaks = numpy.zeros(values.size, dtype=numpy.int64)
    breaks[1:] = (numpy.diff(values) != 1).cumsum()
    consecutive = breaks[offsets + counts - 1] == breaks[offsets]
    return values[offsets].tolist(), consecutive.tolist()
