"""`in_order=False` over a `ShardedStream`: the rest of an epoch cut into whole batches, each
worker reading its own contiguous run of items, so that a slow worker stalls no other.

Positions here are *item positions*: the epoch's shards' items one after another, in the
epoch's shard order (each shard's items in its window-shuffled order): the sequence that
the canonical streams cut into runs, so it is the same for every `canonical_streams`. The
rest of an epoch is a few runs of them (`Runs`), served by one pass so:

- their items, concatenated, are cut into one contiguous share per rank, as many items as
  the rank has in a map-style `Layout` of that length: every rank gets the same number of
  batches, full but for its final one, and `drop_last` / `even_batches` mean what they
  mean (G2; the padding of a final batch repeats the epoch's first items);
- a rank's batches are cut into one contiguous group per worker role, which reads its
  group's items in order (each shard once, but for a shard cut between two groups).

A worker's batches reach the main process in its own order, so what a rank consumed is a
count of batches per role; the runs left over by every rank's counts are the rest of the
epoch that the next pass serves, at any world size, batch size or `num_workers` (G2). The
runs number at most one per role of each pass a job stopped in during the epoch, never
O(items) (G5).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence

from dist_resume.positions.layout import Layout, TailMode

Runs = tuple[tuple[int, int], ...]  # [start, stop) item positions, ascending, disjoint, not touching


def merged_runs(runs: Iterable[tuple[int, int]]) -> Runs:
    """`runs` sorted, empty ones dropped and touching ones joined."""
    result: list[tuple[int, int]] = []
    for start, stop in sorted(run for run in runs if run[0] < run[1]):
        if result and start <= result[-1][1]:
            result[-1] = (result[-1][0], max(stop, result[-1][1]))
        else:
            result.append((start, stop))
    return tuple(result)


def runs_length(runs: Runs) -> int:
    return sum(stop - start for start, stop in runs)


def remaining_after(position: int, stream_lengths: Sequence[int]) -> Runs:
    """The items an in-order pass has not consumed once it stands at epoch position
    `position` of the canonical streams' interleaved order (`streams.canonical`): each
    stream's items from its count of positions below `position` on."""
    streams = len(stream_lengths)
    runs, begin = [], 0
    for stream, length in enumerate(stream_lengths):
        consumed = min(length, max(0, -(-(position - stream) // streams)))
        runs.append((begin + consumed, begin + length))
        begin += length
    return merged_runs(runs)


def past_consumed(runs: Runs, total: int) -> int:
    """The epoch position past every item that `runs`, the rest of an epoch of `total`
    items, leaves consumed."""
    return runs[-1][0] if runs and runs[-1][1] == total else total


def in_order_position(runs: Runs, stream_lengths: Sequence[int]) -> int | None:
    """The epoch position of the canonical streams' order whose rest is exactly `runs`, or
    None if `runs` is no such rest (items were consumed out of that order)."""
    position = sum(stream_lengths) - runs_length(runs)
    return position if remaining_after(position, stream_lengths) == runs else None


class UnorderedPass:
    """`runs` of an epoch of `epoch_items` items served by `world_size` ranks of `roles`
    worker roles, `batch_size` items per batch, the final step by `mode`."""

    def __init__(self, runs: Runs, epoch_items: int, world_size: int, batch_size: int, mode: TailMode,
                 roles: int) -> None:
        self.runs = runs
        self.epoch_items = epoch_items
        self.roles = roles
        self.layout = Layout(runs_length(runs), world_size, batch_size, mode)
        self._ends = list(itertools.accumulate(stop - start for start, stop in runs))
        shares = [self._share(rank) for rank in range(world_size)]
        self._offsets = [0, *itertools.accumulate(shares)]

    def _share(self, rank: int) -> int:
        """Items (padding excluded) of rank `rank`'s batches."""
        batches = self.layout.num_batches(rank)
        if not batches:
            return 0
        last = self.layout.batch(rank, batches - 1)
        return (batches - 1) * self.layout.batch_size + last.stop - last.start

    def num_batches(self, rank: int) -> int:
        return self.layout.num_batches(rank)

    def role_batches(self, rank: int, role: int) -> range:
        """The rank's batches that worker role `role` reads, in its order."""
        base, extra = divmod(self.num_batches(rank), self.roles)
        start = role * base + min(role, extra)
        return range(start, start + base + (role < extra))

    def batch(self, rank: int, index: int) -> tuple[Runs, list[int]]:
        """Rank `rank`'s batch `index`: the runs of its items, and its padding positions."""
        slots = self.layout.batch(rank, index)
        first = self._offsets[rank] + index * self.layout.batch_size
        padding = [(slots.padding_start + i) % self.epoch_items for i in range(slots.padding)]
        return self.positions(first, first + slots.stop - slots.start), padding

    def rank_positions(self, rank: int, first: int, stop: int) -> Runs:
        """The item positions of rank `rank`'s batches `[first, stop)` (padding excluded)."""
        start = self._offsets[rank] + first * self.layout.batch_size
        return self.positions(start, min(self._offsets[rank] + stop * self.layout.batch_size,
                                         self._offsets[rank + 1]))

    def positions(self, start: int, stop: int) -> Runs:
        """The item positions at offsets `[start, stop)` of the runs' concatenation."""
        pieces = []
        index = bisect.bisect_right(self._ends, start)
        while start < stop and index < len(self.runs):
            run_start, run_stop = self.runs[index]
            begin = self._ends[index] - (run_stop - run_start)
            taken = min(stop, self._ends[index]) - start
            pieces.append((run_start + start - begin, run_start + start - begin + taken))
            start += taken
            index += 1
        return tuple(pieces)

    def leftover(self, counts: Mapping[int, Sequence[int]]) -> Runs:
        """The runs not consumed once rank `r`'s role `j` consumed `counts[r][j]` of its
        batches: the rest of the epoch (a dropped tail is dropped only at the epoch's end,
        so it stays)."""
        pieces: list[tuple[int, int]] = []
        size = self.layout.batch_size
        for rank in range(self.layout.world_size):
            end = self._offsets[rank + 1]
            for role, consumed in enumerate(counts[rank]):
                batches = self.role_batches(rank, role)
                start = self._offsets[rank] + (batches.start + consumed) * size
                stop = min(self._offsets[rank] + batches.stop * size, end)
                pieces += self.positions(start, stop)
        pieces += self.positions(self._offsets[-1], self.layout.length)
        return merged_runs(pieces)
