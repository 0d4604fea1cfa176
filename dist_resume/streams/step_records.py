"""What the main process records of a `ShardedStream` (or another step source, see
`steps`): the epoch position its rank's next
batch starts at, and the few integers that fix the epoch's order; saved as a rank's stream
entry, and checked and continued from on resume at any world size and `num_workers`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch

from dist_resume.positions.layout import TailMode
from dist_resume.randomness.per_item import ItemSeeding
from dist_resume.state.fields import RankState, ResumeStateError
from dist_resume.state.saved import SavedStates
from dist_resume.streams.steps import StepResume, StepSettings, epoch_items, step_layout
from dist_resume.streams.stream_state import CANONICAL, CANONICAL_KIND, CanonicalPosition, check_reader, read_position


class StreamSkip(NamedTuple):
    """Global steps a skip passed over, this rank's share of them, and the epoch positions
    they held (padding excluded): `positions` of them, all within `[first_position,
    stop_position)` (all of it but with `in_order=False`, whose ranks skip their own runs)."""

    steps: int
    rank_batches: int
    rank_items: int  # this rank's slots among them, padding included: its consumed items
    first_position: int
    stop_position: int
    positions: int


class StepRecords:
    """The epoch position of this rank's next batch in the current epoch."""

    kind = CANONICAL_KIND
    carry = False  # every pass starts from its position alone

    def __init__(self, stream: Any, slots: int, world_size: int, batch_size: int) -> None:
        """`stream`: a step source (see `steps`)."""
        self._stream = stream
        self.canonical_streams = stream.canonical_streams or slots
        self.world_size = world_size
        self.batch_size = batch_size
        self._position = 0

    @property
    def length(self) -> int:
        """What the loader's state calls the dataset length: the number of shards."""
        return self._stream.saved_length

    @property
    def global_batch(self) -> int:
        return self.world_size * self.batch_size

    @property
    def position(self) -> int:
        """The epoch position this rank's next batch starts at."""
        return self._position

    def start_epoch(self) -> None:
        self._position = 0

    def settings(self, epoch: int, rank: int, mode: TailMode, seed: int, shuffle: bool) -> StepSettings:
        return StepSettings(epoch, rank, self.world_size, self.batch_size, mode, self.canonical_streams,
                            self._position, seed, shuffle)

    def resume(self, settings: StepSettings, collate: Callable[[list[Any]], Any],
               seeding: ItemSeeding | None) -> StepResume:
        self._stream.lengths()  # counted here once, before workers copy the stream
        return StepResume(settings, collate, seeding)

    def num_batches(self, settings: StepSettings) -> int:
        """Batches this rank yields from its position to the epoch's end."""
        return step_layout(self._stream, settings).num_batches(settings.rank)

    def record(self, position: int) -> None:
        self._position = position

    def skip(self, settings: StepSettings, steps: int) -> StreamSkip:
        """Pass over the next `steps` global steps from this rank's position (fewer at the
        epoch's end): the position moves past them, and the next pass's readers start there."""
        layout = step_layout(self._stream, settings)
        # Rank 0 serves every global step of the epoch, the final partial one included.
        steps = min(steps, layout.num_batches(0))
        rank_batches = min(steps, layout.num_batches(settings.rank))
        rank_items = 0
        if rank_batches:
            last = sum(piece.count for piece in layout.batch(settings.rank, rank_batches - 1))
            rank_items = (rank_batches - 1) * settings.batch_size + last
        stop = layout.end(steps - 1) if steps else settings.origin
        self._position = stop
        return StreamSkip(steps, rank_batches, rank_items, settings.origin, stop, stop - settings.origin)

    def digest(self) -> int:
        return self._stream.digest

    def state(self) -> dict[str, Any]:
        position = CanonicalPosition(self.canonical_streams, self.global_batch, self._position,
                                     self._stream.lengths_digest(), self._stream.reader_digest)
        return {CANONICAL: torch.tensor(position, dtype=torch.int64)}

    def accept(self, entries: Mapping[int, Mapping[str, Any]], where: Callable[[int], str], saved: SavedStates,
               rank: int) -> tuple[RankState, Callable[[], None]]:
        """Check every saved rank's entry; return the progress this rank continues and what
        continues the stream from it: its own position when the world size and global batch
        are unchanged (G1), else the position every saved rank reached (G2, G3)."""
        positions = {saved_rank: read_position(entry, where(saved_rank)) for saved_rank, entry in entries.items()}
        first_rank, first = next(iter(positions.items()))
        for saved_rank, position in positions.items():
            if position._replace(position=0) != first._replace(position=0):
                raise ResumeStateError(
                    f"{where(saved_rank)} field {CANONICAL!r} disagrees with the other ranks' entries")
        self._check(first, where(first_rank))
        if (saved.any.world_size, first.global_batch) == (self.world_size, self.global_batch):
            if rank not in saved.ranks:
                saved.require_complete(f"resuming rank {rank}")
            own, position = saved.ranks[rank], positions[rank].position
        else:
            saved.one_epoch(f"at world size {self.world_size} with global batch {self.global_batch}",
                            f"world size {saved.any.world_size} with global batch {first.global_batch}",
                            "world size or global batch")
            position, finished, furthest = _common_position(positions, saved)
            own = dataclasses.replace(furthest, rank=rank, world_size=self.world_size, batch_size=self.batch_size,
                                      global_batch=self.global_batch, epoch_finished=int(finished))
        total = epoch_items(self._stream)
        if position > total:
            raise ResumeStateError(f"{where(first_rank)} field {CANONICAL!r} says epoch position {position} of an "
                                   f"epoch of {total} items")

        def adopt() -> None:
            self.canonical_streams, self._position = first.canonical_streams, position

        return own, adopt

    def continue_at(self, position: int, saved: SavedStates, rank: int) -> tuple[RankState, Callable[[], None]]:
        """The progress this rank continues from epoch position `position` (the rest of a
        state saved in another order, see `cursor`), and what adopts the position."""
        furthest = max(saved.ranks.values(), key=lambda state: state.batches_consumed)
        finished = position == epoch_items(self._stream)
        own = dataclasses.replace(furthest, rank=rank, world_size=self.world_size, batch_size=self.batch_size,
                                  global_batch=self.global_batch, epoch_finished=int(finished))

        def adopt() -> None:
            self._position = position

        return own, adopt

    def _check(self, position: CanonicalPosition, where: str) -> None:
        stream = self._stream
        if stream.canonical_streams is not None and position.canonical_streams != stream.canonical_streams:
            raise ResumeStateError(f"{where} field {CANONICAL!r} was saved with canonical_streams="
                                   f"{position.canonical_streams}; this {stream.kind_name} has canonical_streams="
                                   f"{stream.canonical_streams}")
        check_reader(position.reader_digest, stream, where, CANONICAL)
        if position.lengths_digest != stream.lengths_digest():
            raise ResumeStateError(f"{where} field {CANONICAL!r} was saved for shards of other item counts: a "
                                   "shard changed since, or lengths= differs from the counts the state was saved with")


def _common_position(positions: Mapping[int, CanonicalPosition], saved: SavedStates) -> tuple[int, bool, RankState]:
    """The epoch position every saved rank has passed, from which a re-partitioned resume
    continues; whether all of them finished the epoch; the state of a rank that consumed
    the most batches (whose counts the resumed ranks carry on). A rank
    that finished its epoch has no batch at or after its position; every other rank must
    stand at one and the same position."""
    states = saved.ranks
    running = {rank: position.position for rank, position in positions.items() if not states[rank].epoch_finished}
    done = [position.position for rank, position in positions.items() if states[rank].epoch_finished]
    if not running:
        return max(done), True, max(states.values(), key=lambda state: state.batches_consumed)
    position = max(running.values())
    if len(set(running.values())) > 1 or any(finished > position for finished in done):
        where = ", ".join(f"rank {rank} at {position.position}" for rank, position in sorted(positions.items()))
        raise ResumeStateError(
            f"saved ranks stopped at different epoch positions of a ShardedStream ({where}); a resume at another "
            "world size or global batch continues from a position every rank reached: save every rank after the "
            f"same number of batches, or resume at world size {saved.any.world_size} with global batch "
            f"{saved.any.global_batch}")
    return position, False, max((states[rank] for rank in running), key=lambda state: state.batches_consumed)
