"""What the main process records of a `ShardedStream` (or another step source, such as a
`Mixture` of streams, see `steps`) read with `in_order=False`: the rest of
the epoch its pass serves and how many batches each worker role of this rank handed to the
training loop (`unordered_pass`); saved as the rank's stream entry and continued on resume,
at the same or another world size, batch size or `num_workers` (G1 for in_order=False, G2).

Entry fields, besides ``meta``: ``"unordered"``: int64[lengths digest, reader digest,
batches consumed by each role] and `RUNS_KEY`: int64[start, stop, start, stop, ...], the
pass's runs (the same on every rank of a job). Its size changes with the runs, so plain
`dcp.load` into a fresh loader fails DCP's size check on a key whose name says what to use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dist_resume.positions.layout import TailMode
from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.state.fields import RankState, ResumeStateError
from dist_resume.state.saved import SavedStates
from dist_resume.streams.step_records import StreamSkip
from dist_resume.streams.steps import epoch_items
from dist_resume.streams.stream_state import UNORDERED_KIND, check_reader, int_list
from dist_resume.streams.unordered_pass import Runs, UnorderedPass, merged_runs, runs_length
from dist_resume.streams.unordered_reader import UnorderedResume
from dist_resume.workers.roles import Tagged

UNORDERED = "unordered"
RUNS_KEY = "runs__load_with_dist_resume_load_checkpoint"


class UnorderedRecords:
    """This rank's batches per worker role in the current pass of a `ShardedStream` (or
    another step source: its epoch positions, as its `item_reader` reads them)."""

    kind = UNORDERED_KIND
    carry = False

    def __init__(self, stream: Any, world_size: int, batch_size: int, roles: int) -> None:
        self._stream = stream
        self.world_size = world_size
        self.batch_size = batch_size
        self.roles = roles
        self._runs: Runs | None = None  # None: the whole epoch
        self._counts = [0] * roles
        # Loaded from every rank's entry, nothing handed on since: the rest of the epoch, from
        # which a skip starts a new pass (the same on every rank), whatever each rank's counts.
        self._loaded_rest: Runs | None = None

    @property
    def length(self) -> int:
        """What the loader's state calls the dataset length: the number of shards."""
        return self._stream.saved_length

    def start_epoch(self) -> None:
        self._runs = None
        self._counts = [0] * self.roles
        self._loaded_rest = None

    def _pass(self, mode: TailMode, fresh: bool = False) -> UnorderedPass:
        total = epoch_items(self._stream)
        runs = merged_runs([(0, total)]) if fresh or self._runs is None else self._runs
        return UnorderedPass(runs, total, self.world_size, self.batch_size, mode, self.roles)

    def remaining(self, rank: int, mode: TailMode, fresh: bool) -> int:
        """Batches this rank still yields in the pass (`fresh`: in a new epoch's)."""
        served = self._pass(mode, fresh)
        counts = [0] * self.roles if fresh else self._counts
        return sum(len(served.role_batches(rank, role)) - counts[role] for role in range(self.roles))

    def resume(self, epoch: int, rank: int, mode: TailMode, collate: Callable[[list[Any]], Any],
               seeding: ItemSeeding | None, seed: int, shuffle: bool) -> UnorderedResume:
        self._stream.lengths()  # counted here once, before workers copy the stream
        return UnorderedResume(self._pass(mode), epoch, rank, list(self._counts), collate, seeding, seed, shuffle)

    def record(self, tagged: Tagged) -> None:
        """A batch of `tagged.role` was handed to the training loop."""
        self._counts[tagged.role] += 1
        self._loaded_rest = None

    def holes(self, rank: int, mode: TailMode) -> list[int]:
        """This rank's batches of the pass not handed on below the highest one that was
        (none right after a load of every rank's entry: a skip starts a new pass then)."""
        if self._loaded_rest is not None:
            return []
        served = self._pass(mode)
        handed = {index for role, count in enumerate(self._counts) for index in served.role_batches(rank, role)[:count]}
        return [index for index in range(max(handed, default=-1)) if index not in handed]

    def skip(self, rank: int, mode: TailMode, steps: int) -> StreamSkip:
        """Pass over the next `steps` batches of every rank (fewer at the pass's end) from the
        consumed prefix of its batches (`holes` is empty), which is the same count on every
        rank that took the same number of steps: each role's count moves past them, so its
        reader starts after them and reads past them (whole shards by their item counts,
        the current one item by item); the positions skipped over all ranks, the same on
        every rank."""
        if self._loaded_rest is not None:
            self._runs, self._counts, self._loaded_rest = self._loaded_rest, [0] * self.roles, None
        served = self._pass(mode)
        done = sum(self._counts)
        steps = min(steps, served.num_batches(0) - done)  # rank 0 has every global step
        rank_batches = max(0, min(steps, served.num_batches(rank) - done))
        layout = served.layout
        rank_items = layout.slots_before(rank, done + rank_batches) - layout.slots_before(rank, done)
        skipped = merged_runs(run for other in range(self.world_size)
                              for run in served.rank_positions(other, done, done + steps))
        groups = [served.role_batches(rank, role) for role in range(self.roles)]
        self._counts = [min(max(done + rank_batches - group.start, 0), len(group)) for group in groups]
        first, stop = (skipped[0][0], skipped[-1][1]) if skipped else (0, 0)
        return StreamSkip(steps, rank_batches, rank_items, first, stop, runs_length(skipped))

    def digest(self) -> int:
        return self._stream.digest

    def state(self) -> dict[str, Any]:
        stream = self._stream
        runs = self._runs if self._runs is not None else merged_runs([(0, epoch_items(stream))])
        values = [stream.lengths_digest(), stream.reader_digest, *self._counts]
        return {UNORDERED: torch.tensor(values, dtype=torch.int64),
                RUNS_KEY: torch.tensor([value for run in runs for value in run], dtype=torch.int64)}

    def rest_of_epoch(self, entries: Mapping[int, Mapping[str, Any]], where: Callable[[int], str],
                      saved: SavedStates, roles: int, mode: TailMode) -> Runs:
        """The items no saved rank consumed (needs every rank's entry)."""
        saved.one_epoch("with in_order=True", "in_order=False", "order of delivery")
        served, counts = self._saved_pass(entries, where, saved, roles, mode)
        return served.leftover(counts)

    def accept(self, entries: Mapping[int, Mapping[str, Any]], where: Callable[[int], str], saved: SavedStates,
               rank: int, roles: int, mode: TailMode) -> tuple[RankState, Callable[[], None]]:
        """Check every saved rank's entry (saved with `roles` worker roles); return the
        progress this rank continues and what continues the stream from it: its own roles'
        counts in an unchanged layout (G1), else a new pass over what no rank consumed (G2)."""
        served, counts = self._saved_pass(entries, where, saved, roles, mode)
        if (saved.any.world_size, saved.any.batch_size, roles) == (self.world_size, self.batch_size, self.roles):
            if rank not in saved.ranks:
                saved.require_complete(f"resuming rank {rank}")
            runs, own_counts = served.runs, counts[rank]
            own = saved.ranks[rank]
        else:
            saved.one_epoch(f"at world size {self.world_size}, batch size {self.batch_size}, {self.roles} worker "
                            "role(s)", f"world size {saved.any.world_size}, batch size {saved.any.batch_size}, "
                            f"{roles} worker role(s)", "world size, batch size or num_workers")
            runs, own_counts = served.leftover(counts), [0] * self.roles
            furthest = max(saved.ranks.values(), key=lambda state: state.batches_consumed)
            finished = UnorderedPass(runs, served.epoch_items, self.world_size, self.batch_size, mode,
                                     self.roles).num_batches(rank) == 0
            own = dataclasses.replace(furthest, rank=rank, world_size=self.world_size, batch_size=self.batch_size,
                                      global_batch=self.world_size * self.batch_size, epoch_finished=int(finished))

        complete = len(entries) == saved.any.world_size
        rest = served.leftover(counts) if complete else None

        def adopt() -> None:
            self._runs, self._counts, self._loaded_rest = runs, own_counts, rest

        return own, adopt

    def continue_in_order(self, runs: Runs) -> Callable[[], None]:
        """What starts this rank's pass over `runs` (the rest of an in-order state)."""

        def adopt() -> None:
            self._runs, self._counts, self._loaded_rest = runs, [0] * self.roles, None

        return adopt

    def _saved_pass(self, entries: Mapping[int, Mapping[str, Any]], where: Callable[[int], str],
                    saved: SavedStates, roles: int, mode: TailMode) -> tuple[UnorderedPass, dict[int, list[int]]]:
        stream = self._stream
        for saved_rank, entry in entries.items():
            lengths_digest, reader_digest = int_list(entry, UNORDERED, where(saved_rank), 2 + roles)[:2]
            check_reader(reader_digest, stream, where(saved_rank), UNORDERED)
            if lengths_digest != stream.lengths_digest():
                raise ResumeStateError(f"{where(saved_rank)} field {UNORDERED!r} was saved for shards of other item "
                                       "counts: a shard changed since, or lengths= differs")
        return saved_pass(entries, where, saved, roles, mode, epoch_items(stream))


def saved_pass(entries: Mapping[int, Mapping[str, Any]], where: Callable[[int], str], saved: SavedStates,
               roles: int, mode: TailMode, total: int) -> tuple[UnorderedPass, dict[int, list[int]]]:
    """The pass the saved ranks' entries (saved with `roles` worker roles, `mode`, an epoch
    of `total` items) served, and each rank's batches per role; every value checked."""
    counts, runs = {}, None
    for saved_rank, entry in entries.items():
        counts[saved_rank] = int_list(entry, UNORDERED, where(saved_rank), 2 + roles)[2:]
        own_runs = _read_runs(entry, where(saved_rank), total)
        if runs is not None and own_runs != runs:
            raise ResumeStateError(f"{where(saved_rank)} field {RUNS_KEY!r} disagrees with the other ranks' entries")
        runs = own_runs
    state = saved.any
    served = UnorderedPass(runs, total, state.world_size, state.batch_size, mode, roles)
    for saved_rank, rank_counts in counts.items():
        for role, count in enumerate(rank_counts):
            if not 0 <= count <= len(served.role_batches(saved_rank, role)):
                raise ResumeStateError(
                    f"{where(saved_rank)} field {UNORDERED!r} says role {role} consumed {count} batches of "
                    f"its {len(served.role_batches(saved_rank, role))}")
    return served, counts


def _read_runs(entry: Mapping[str, Any], where: str, total: int) -> Runs:
    values = entry.get(RUNS_KEY)
    if not isinstance(values, torch.Tensor) or values.dtype != torch.int64 or values.dim() != 1:
        raise ResumeStateError(f"{where} has no 1-D int64 {RUNS_KEY!r} tensor")
    flat = values.tolist()
    runs = tuple(zip(flat[::2], flat[1::2]))
    if len(flat) % 2 or merged_runs(runs) != runs or (runs and not 0 <= runs[0][0] <= runs[-1][1] <= total):
        raise ResumeStateError(f"{where} field {RUNS_KEY!r} is not ascending runs of an epoch of {total} items")
    return runs
