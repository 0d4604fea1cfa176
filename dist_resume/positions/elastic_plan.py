"""The stream of positions an epoch still has to serve, after any number of elastic resumes.

A fresh epoch's stream is its positions `0 .. L-1`. When a job stops, the slots its ranks
did not consume become the next job's stream, in global-step order: a `Level`. A `Plan`
is the stack of levels of one epoch; it maps any slot of its stream to a position in
O(log world size), and its size is O(world size) of the jobs whose leftovers are still
pending, never O(dataset length).
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass

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
    # (rank, batch) below consumed[rank] that were not consumed (in_order=False), in
    # global-step order: the leftover stream starts with their slots.
    holes: tuple[tuple[int, int], ...] = ()


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
            self._check_holes(level)
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
        self._check_holes(level)
        self._lag_order = sorted(range(level.world_size), key=lambda rank: (level.consumed[rank], rank))
        counts = [level.consumed[rank] for rank in self._lag_order]
        full_steps = layout.full_steps
        lowest, highest = counts[0], counts[-1]
        self.first_access = level.base + lowest * layout.global_batch
        offset = 0
        self._hole_offsets: list[int] = []
        self._hole_blocks: list[tuple[int, int]] = []
        for rank, index in level.holes:
            batch = layout.batch(rank, index)
            if batch.stop > batch.start:
                self._hole_offsets.append(offset)
                self._hole_blocks.append((batch.start, batch.stop))
                offset += batch.stop - batch.start
        if self._hole_blocks:
            self.first_access = min(self.first_access, level.base + self._hole_blocks[0][0])

        # Full steps [lowest, min(highest, full_steps)): the ranks lagging at step k are
        # those with consumed <= k, a prefix of the lag order that grows with k.
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

    def _check_holes(self, level: Level) -> None:
        keys = [(index, rank) for rank, index in level.holes]
        if any(a >= b for a, b in zip(keys, keys[1:])):
            raise ValueError(f"holes {list(level.holes)} are not in global-step order")
        for rank, index in level.holes:
            if not (0 <= rank < level.world_size and 0 <= index < level.consumed[rank]):
                raise ValueError(f"hole (rank {rank}, batch {index}) is not a batch its rank passed")

    def _catch_up_runs(self, start: int, stop: int) -> list[tuple[int, int]]:
        runs: list[tuple[int, int]] = []
        slot = _block_runs(self._hole_offsets, self._hole_blocks, start, stop, runs)
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
        _block_runs(self._final_offsets, self._final_blocks, slot, stop, runs)
        return runs


def _block_runs(offsets: list[int], blocks: list[tuple[int, int]], slot: int, stop: int,
                runs: list[tuple[int, int]]) -> int:
    """Append the parent runs of slots `[slot, stop)` that fall in `blocks` (laid end to end
    from `offsets`); returns the first slot past them."""
    block = bisect.bisect_right(offsets, slot) - 1
    while slot < stop and 0 <= block < len(blocks):
        block_start, block_stop = blocks[block]
        within = slot - offsets[block]
        if within >= block_stop - block_start:
            break
        count = min(block_stop - block_start - within, stop - slot)
        runs.append((block_start + within, count))
        slot += count
        block += 1
    return slot


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

    def after(self, layout: Layout, consumed: list[int], holes: tuple[tuple[int, int], ...] = ()) -> Plan:
        """The plan for what is left once the ranks of `layout` (laid over this plan's
        stream) consumed `consumed[r]` batches each (an empty stream if nothing is), except
        the (rank, batch) `holes` among them, in global-step order (in_order=False)."""
        if layout.length != self.length:
            raise ValueError(f"layout covers {layout.length} slots, the plan has {self.length}")
        level = Level(0, layout.world_size, layout.batch_size, tuple(consumed), tuple(holes))
        bound = _BoundLevel(level, self.length, self.mode)
        if bound.length == 0:
            bound = _BoundLevel(Level(self.length), self.length, self.mode)
        elif len(set(consumed)) == 1 and consumed[0] <= layout.full_steps and not bound.level.holes:
            bound = _BoundLevel(Level(consumed[0] * layout.global_batch), self.length, self.mode)
        stack = list(self._bound)
        # A level that reads its parent only past the parent's catch-up sees the
        # parent as a plain shift: fold it into the grandparent so the plan keeps
        # only the levels whose leftovers are still pending.
        while stack and stack[-1].catch_up <= bound.first_access:
            parent = stack.pop()
            shift = parent.level.base + parent.tail_start - parent.catch_up
            level = bound.level
            rebased = dataclasses.replace(level, base=level.base + shift)
            grandparent_length = stack[-1].length if stack else self.dataset_length
            bound = _BoundLevel(rebased, grandparent_length, self.mode)
        levels = tuple(b.level for b in stack) + (bound.level,)
        return Plan(self.dataset_length, self.mode, self.epoch, levels)

    def encode(self) -> list[int]:
        """`[epoch, levels, (base, world_size, batch_size, consumed...) per level]`, then,
        only if some level has holes, `[holes, (level, rank, batch) per hole]`; [] if empty."""
        if not self.levels:
            return []
        values = [self.epoch, len(self.levels)]
        for level in self.levels:
            values += [level.base, level.world_size, level.batch_size, *level.consumed]
        holes = [(number, *hole) for number, level in enumerate(self.levels) for hole in level.holes]
        if holes:
            values += [len(holes), *(value for hole in holes for value in hole)]
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
        if cursor < len(values):
            holes = values[cursor + 1 : cursor + 1 + 3 * values[cursor]]
            if values[cursor] < 1 or len(holes) != 3 * values[cursor]:
                raise ValueError("elastic plan's holes are truncated")
            cursor += 1 + len(holes)
            for number, rank, batch in zip(holes[::3], holes[1::3], holes[2::3]):
                if not 0 <= number < len(levels):
                    raise ValueError(f"elastic plan has a hole in level {number} of {len(levels)}")
                levels[number] = dataclasses.replace(levels[number], holes=(*levels[number].holes, (rank, batch)))
        if cursor != len(values):
            raise ValueError(f"elastic plan has {len(values) - cursor} trailing values")
        return cls(dataset_length, mode, plan_epoch, tuple(levels))

