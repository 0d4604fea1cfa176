"""The stream of positions an epoch still has to serve, after any number of elastic resumes.

A fresh epoch's stream is its positions `0 .. L-1`. When a job stops, the slots its ranks
did not consume become the next job's stream, in global-step order: a `Level`. A `Plan`
is the stack of levels of one epoch; it maps any slot of its stream to a position in
O(log world size), and its size is O(world size) of the jobs whose leftovers are still
pending, never O(dataset length).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from dist_resume.positions.layout import Layout, TailMode


@dataclass(frozen=True)
class Level:
    """A stopped job: `world_size` ranks that consumed `consumed[r]` batches of
    `batch_size` from the parent stream shifted by `base`. `world_size == 0` is a
    plain shift: the stream from slot `base` on."""

    base: int
    world_size: int = 0
    batch_size: int = 0
    consumed: tuple[int, ...] = ()


@dataclass(frozen=True)
class _FullSteps:
    offset: int  # first leftover slot of this segment
    first_step: int
    steps: int
    lagging: int  # the first `lagging` ranks of the level's lag order have not consumed these steps


class _BoundLevel:
    """A level over a parent stream of known length: its leftover, slot by slot."""

    def __init__(self, level: Level, parent_length: int, mode: TailMode) -> None:
        if not 0 <= level.base <= parent_length:
            raise ValueError(f"level base {level.base} is outside a stream of {parent_length} slots")
        self.level = level
        shifted_length = parent_length - level.base
        self._segments: list[_FullSteps] = []
        self._segment_offsets: list[int] = []
        self._final_blocks: list[tuple[int, int]] = []
        self._final_offsets: list[int] = []
        self.first_access = level.base
        if level.world_size == 0:
            self.catch_up = 0
            self.tail_start = 0
            self.length = shifted_length
            return
        layout = Layout(shifted_length, level.world_size, level.batch_size, mode)
        if len(level.consumed) != level.world_size:
            raise ValueError(
                f"a level of world size {level.world_size} needs {level.world_size} counts, "
                f"got {len(level.consumed)}"
            )
        for rank, count in enumerate(level.consumed):
            available = layout.num_batches(rank)
            if not 0 <= count <= available:
                raise ValueError(
                    f"rank {rank} of {level.world_size} consumed {count} batches, "
                    f"but its epoch has {available}"
                )
        self._layout = layout
        self._lag_order = sorted(range(level.world_size), key=lambda rank: (level.consumed[rank], rank))
        counts = [level.consumed[rank] for rank in self._lag_order]
        full_steps = layout.full_steps
        lowest, highest = counts[0], counts[-1]
        self.first_access = level.base + lowest * layout.global_batch

        # Full steps [lowest, min(highest, full_steps)): the ranks lagging at step k are
        # those with consumed <= k, a prefix of the lag order that grows with k.
        offset = 0
        end = min(highest, full_steps)
        for lagging, count in enumerate(counts, start=1):
            if count >= end:
                break
            if lagging < len(counts) and counts[lagging] == count:
                continue
            next_count = min(counts[lagging], end) if lagging < len(counts) else end
            self._segments.append(_FullSteps(offset, count, next_count - count, lagging))
            self._segment_offsets.append(offset)
            offset += (next_count - count) * lagging * layout.batch_size

        if highest > full_steps:  # some rank consumed its final, partial batch
            for rank in self._lag_order:
                if level.consumed[rank] <= full_steps < layout.num_batches(rank):
                    batch = layout.batch(rank, full_steps)
                    if batch.stop > batch.start:
                        self._final_offsets.append(offset)
                        self._final_blocks.append((batch.start, batch.stop))
                        offset += batch.stop - batch.start
        self.catch_up = offset
        self.tail_start = min(highest * layout.global_batch, shifted_length)
        self.length = offset + shifted_length - self.tail_start

    def runs(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Parent slots of this level's slots `[start, stop)`, as (first, count) runs in order."""
        runs: list[tuple[int, int]] = []
        base = self.level.base
        if start < self.catch_up:
            for first, count in self._catch_up_runs(start, min(stop, self.catch_up)):
                runs.append((base + first, count))
        if stop > self.catch_up:
            first = max(start, self.catch_up)
            runs.append((base + self.tail_start + first - self.catch_up, stop - first))
        return runs

    def _catch_up_runs(self, start: int, stop: int) -> list[tuple[int, int]]:
        runs = []
        slot = start
        batch_size = self.level.batch_size
        global_batch = self._layout.global_batch
        index = bisect.bisect_right(self._segment_offsets, slot) - 1
        while slot < stop and 0 <= index < len(self._segments):
            segment = self._segments[index]
            per_step = segment.lagging * batch_size
            segment_end = segment.offset + segment.steps * per_step
            while slot < min(stop, segment_end):
                local = slot - segment.offset
                step = segment.first_step + local // per_step
                rank = self._lag_order[(local % per_step) // batch_size]
                within = local % batch_size
                count = min(batch_size - within, stop - slot)
                runs.append((step * global_batch + rank * batch_size + within, count))
                slot += count
            index += 1
        block = bisect.bisect_right(self._final_offsets, slot) - 1
        while slot < stop and 0 <= block < len(self._final_blocks):
            block_start, block_stop = self._final_blocks[block]
            within = slot - self._final_offsets[block]
            count = min(block_stop - block_start - within, stop - slot)
            runs.append((block_start + within, count))
            slot += count
            block += 1
        return runs


class Plan:
    """The remaining stream of epoch `epoch`: slot -> position, through a stack of levels."""

    def __init__(self, dataset_length: int, mode: TailMode, epoch: int, levels: tuple[Level, ...] = ()) -> None:
        self.dataset_length = dataset_length
        self.mode = mode
        self.epoch = epoch
        self.levels = levels
        self._bound: list[_BoundLevel] = []
        length = dataset_length
        for level in levels:
            bound = _BoundLevel(level, length, mode)
            self._bound.append(bound)
            length = bound.length
        self.length = length

    @property
    def shift(self) -> int | None:
        """The plan as one offset (slot s is position shift + s), or None if it is not one."""
        if not self.levels:
            return 0
        if len(self.levels) == 1 and self.levels[0].world_size == 0:
            return self.levels[0].base
        return None

    def frontier(self, slots: int) -> int:
        """A position past every position that earlier jobs consumed of this epoch and past
        those of the stream's slots `[0, slots)`: every position from it on is the
        position of a slot `>= slots`."""
        position = slots
        for bound in reversed(self._bound):
            position = bound.level.base + bound.tail_start + max(0, position - bound.catch_up)
        return position

    def runs(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Positions of slots `[start, stop)`, as (first, count) runs in slot order."""
        runs = [(start, stop - start)] if stop > start else []
        for bound in reversed(self._bound):
            runs = [run for first, count in runs for run in bound.runs(first, first + count)]
        merged: list[tuple[int, int]] = []
        for first, count in runs:
            if merged and merged[-1][0] + merged[-1][1] == first:
                merged[-1] = (merged[-1][0], merged[-1][1] + count)
            else:
                merged.append((first, count))
        return merged

    def after(self, layout: Layout, consumed: list[int]) -> Plan:
        """The plan for what is left once the ranks of `layout` (laid over this plan's
        stream) consumed `consumed[r]` batches each (an empty stream if nothing is)."""
        if layout.length != self.length:
            raise ValueError(f"layout covers {layout.length} slots, the plan has {self.length}")
        level = Level(0, layout.world_size, layout.batch_size, tuple(consumed))
        bound = _BoundLevel(level, self.length, self.mode)
        if bound.length == 0:
            bound = _BoundLevel(Level(self.length), self.length, self.mode)
        elif len(set(consumed)) == 1 and consumed[0] <= layout.full_steps:
            bound = _BoundLevel(Level(consumed[0] * layout.global_batch), self.length, self.mode)
        stack = list(self._bound)
        # A level that reads its parent only past the parent's catch-up sees the
        # parent as a plain shift: fold it into the grandparent so the plan keeps
        # only the levels whose leftovers are still pending.
        while stack and stack[-1].catch_up <= bound.first_access:
            parent = stack.pop()
            shift = parent.level.base + parent.tail_start - parent.catch_up
            level = bound.level
            rebased = Level(level.base + shift, level.world_size, level.batch_size, level.consumed)
            grandparent_length = stack[-1].length if stack else self.dataset_length
            bound = _BoundLevel(rebased, grandparent_length, self.mode)
        levels = tuple(b.level for b in stack) + (bound.level,)
        return Plan(self.dataset_length, self.mode, self.epoch, levels)

    def encode(self) -> list[int]:
        """`[epoch, levels, (base, world_size, batch_size, consumed...) per level]`; [] if empty."""
        if not self.levels:
            return []
        values = [self.epoch, len(self.levels)]
        for level in self.levels:
            values += [level.base, level.world_size, level.batch_size, *level.consumed]
        return values

    @classmethod
    def decode(cls, values: list[int], dataset_length: int, mode: TailMode, epoch: int) -> Plan:
        """The plan `encode` wrote; an empty encoding is the fresh stream of `epoch`."""
        if not values:
            return cls(dataset_length, mode, epoch)
        if len(values) < 2:
            raise ValueError(f"elastic plan is truncated: {values}")
        plan_epoch, count = values[0], values[1]
        levels = []
        cursor = 2
        for _ in range(count):
            if cursor + 3 > len(values):
                raise ValueError("elastic plan is truncated")
            base, world_size, batch_size = values[cursor : cursor + 3]
            consumed = tuple(values[cursor + 3 : cursor + 3 + world_size])
            if world_size < 0 or len(consumed) != world_size:
                raise ValueError("elastic plan is truncated")
            levels.append(Level(base, world_size, batch_size, consumed))
            cursor += 3 + world_size
        if cursor != len(values):
            raise ValueError(f"elastic plan has {len(values) - cursor} trailing values")
        return cls(dataset_length, mode, plan_epoch, tuple(levels))


def rank_positions(plan: Plan, layout: Layout, rank: int, first: int, stop: int) -> tuple[torch.Tensor, list[int]]:
    """Positions of batches `[first, stop)` of rank `rank` (padding included), concatenated,
    and the size of each batch."""
    parts: list[torch.Tensor] = []
    sizes: list[int] = []
    shift = plan.shift
    full_stop = min(stop, layout.full_steps)
    if shift is not None and first < full_stop:
        # Full steps of a shifted stream: one vectorized block.
        starts = torch.arange(first, full_stop) * layout.global_batch + (shift + rank * layout.batch_size)
        parts.append((starts[:, None] + torch.arange(layout.batch_size)).reshape(-1))
        sizes += [layout.batch_size] * (full_stop - first)
        first = full_stop
    for index in range(first, stop):
        batch = layout.batch(rank, index)
        runs = [torch.arange(start, start + count) for start, count in plan.runs(batch.start, batch.stop)]
        padding = torch.arange(batch.padding_start, batch.padding_start + batch.padding) % max(plan.dataset_length, 1)
        parts += runs + [padding]
        sizes.append(len(batch))
    if not parts:
        return torch.empty(0, dtype=torch.int64), sizes
    return torch.cat(parts), sizes
