"""One rank of a replica group of a fault-tolerant job, served by a `ResumableDataLoader` one
step at a time. The groups that take part change from step to step and a step they trained
may not commit; the epoch's position is a function of the committed steps only (G2 over
committed steps): a committed step with `n` participating groups of `W` ranks consumed the
next global step of a layout of `n * W` ranks, an uncommitted one consumed nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from dist_resume.loader.resumable import ResumableDataLoader


class ReplicaSteps:
    """The steps of one rank: `settle` the previous step's outcome, then `serve` the next
    step's batch for the groups that take part in it.

    The loader's own shard (`home_shard`, rank `g` of the group's `W` ranks) stays its state's
    shard. A group that takes part as the `r`-th of `n` serves rank `r * W + g` of `n * W`,
    batch by batch from one pass of the loader while the same groups commit every step (the
    workers prefetch those batches); any other outcome restarts the pass from the committed
    position, the prefetched batches dropped (`regroup`). A group that does not take part (it
    is healing, or a spare) is handed the batch of rank `g`, the first group's part of the
    step, and its gradients are zeroed by its framework: its step counts as the others'."""

    def __init__(self, loader: ResumableDataLoader) -> None:
        if (loader.drop_last, loader.even_batches) != (False, True):
            raise ValueError(
                "a loader served to replica groups needs drop_last=False, even_batches=True (the defaults): the "
                "final step of an epoch is padded so that every group takes part in it, whatever the number of "
                "groups then, which is known only once the step's quorum formed (with drop_last=True, whether its "
                f"positions fill a step would depend on it); got drop_last={loader.drop_last}, "
                f"even_batches={loader.even_batches}")
        self.loader = loader
        self.home_rank, self.home_world = loader.home_shard
        self._pass: Iterator[Any] | None = None
        self._pending: int | None = None  # the world size of the step served and not settled
        self.epoch_ended = False
        self.loaded()

    # -- the position -------------------------------------------------------------

    def loaded(self) -> None:
        """The loader took a state at its own shard (a peer's, handed over; a checkpoint's): serve
        from there. A step served and not settled keeps its outcome to come."""
        self._regroup(self.home_rank, self.home_world, None)

    def _regroup(self, rank: int, world_size: int, consumed: int | None) -> None:
        self.loader.regroup(rank, world_size, consumed)
        self._world = world_size
        self._count = 0  # committed global steps of the loader's layout of `_world` ranks
        self._yielded = 0  # batches `_pass` yielded
        self._steps = len(self.loader)  # global steps in that layout (every rank has a batch of each)
        self.epoch = self.loader.epoch
        self._pass = None

    @property
    def pending(self) -> bool:
        """Whether a served step waits for its outcome."""
        return self._pending is not None

    def settle(self, committed: bool) -> None:
        """The served step committed or not. Leaves the loader at the committed position (its
        state, taken now, is the committed history's); a committed step that completes the
        epoch moves it to the next epoch (`epoch_ended`)."""
        world, self._pending = self._pending, None
        if world is None:
            return
        if committed:
            if world != self._world:  # no batch of this layout was served here: the group healed
                self._regroup(self.home_rank, world, self._count)
            self._count += 1
            if self._count == self._steps:
                self._regroup(self.loader.rank, self._world, self._count)
                self.epoch_ended = True
                return
        self.committed_position()

    def committed_position(self) -> None:
        """Leave the loader at the committed position, its state the committed history's. While
        its pass ran ahead of it (a step not committed, or served and without an outcome yet: a
        state taken mid-step), or behind it (steps this rank was not served), the pass restarts;
        a step without an outcome yet still counts if it commits."""
        if self._yielded != self._count:
            self._regroup(self.loader.rank, self._world, self._count)

    # -- serving ------------------------------------------------------------------

    def begin_epoch(self) -> None:
        """Start serving the loader's epoch; one without a step ends at once."""
        self.epoch_ended = False
        if self._steps == 0 and not self.pending:
            for _ in iter(self.loader):  # an empty pass: the loader moves to the next epoch
                raise AssertionError("a pass of no steps yielded a batch")
            self._regroup(self.loader.rank, self._world, None)
            self.epoch_ended = True

    def serve(self, replicas: int, replica_rank: int | None) -> Any:
        """This rank's batch of the next step of `replicas` participating groups, this group
        being the `replica_rank`-th of them (None: it does not take part)."""
        world = replicas * self.home_world
        rank = self.home_rank if replica_rank is None else replica_rank * self.home_world + self.home_rank
        fits = (self._pass is not None and self._world == world and self._yielded == self._count
                and (replica_rank is None or self.loader.rank == rank))
        if not fits:
            self._regroup(rank, world, self._count)
            self._pass = iter(self.loader)
        batch = next(self._pass)
        self._yielded += 1
        self._pending = world
        return batch
