"""`ResumableDataLoader.skip`: pass over the next global batches without reading a sample,
and the record of what was skipped, saved with the loader's state (G2, G5)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any


from dist_resume.arguments import checked_int
from dist_resume.loader.progress import Progress
from dist_resume.positions.skip_span import SkipSpan, skip_span
from dist_resume.state.fields import Sampling, rank_key
from dist_resume.state.saved import SavedStates
from dist_resume.state.skips import SKIPS_KEY, SkipLedger, SkippedRange, saved_ledger

_SUPPORTED = ("skip() supports a map-style dataset, a Mixture or a ShardedStream (and Mixtures of them) in the "
              "loader's own order")


class BatchSkipping:
    """`skip` and `skipped` of `ResumableDataLoader` (a mixin over its position: `_progress`,
    `_skips`, `_resume_pending`, `_generation`, `_home`)."""

    def skip(self, batches: int) -> int:
        """Pass over the next `batches` global batches of the epoch the next `iter()` serves,
        without reading any of their samples (a `ShardedStream`, or a Mixture of them, reads
        past them instead: whole shards are passed over by their item counts, and each
        canonical stream reads its current shard up to the new position); return how many
        were skipped. With `in_order=False` a skip starts from the consumed prefix: it is
        refused while the pass delivered batches beyond it; on a stream each rank passes
        over its own next batches of the pass (right after a load of every rank's entry, of
        a new pass over the rest), each worker's reader reading past at most the shard its
        run starts in.

        Every rank calls it with the same number (a collective save refuses ranks that
        skipped differently). The skipped positions count as consumed (G2): no rank trains
        them, in this job or after a resume at any world size, `num_workers` or batch size;
        `skipped` and `dist-resume inspect` list them. Like `load_state_dict`, it takes
        effect at the next `iter()`: a running iterator stops with an error at its next batch,
        and the batches its workers prefetched are dropped, never yielded. A skip that
        reaches past the epoch's end stops there: it returns the batches it skipped and
        warns; the next `iter()` then yields no batch, and the one after starts the next
        epoch. Other IterableDatasets and custom samplers are refused."""
        batches = checked_int("batches", batches, 0)
        if self._stream is not None and not self._stream.skippable:
            raise ValueError(f"{_SUPPORTED}; this loader reads an IterableDataset other than a ShardedStream, "
                             "whose stream has no positions to skip to")
        if self._stream is None and self._sampling is not Sampling.EPOCH_ORDER:
            raise ValueError(f"{_SUPPORTED}; this loader takes its indices from a custom sampler or batch_sampler")
        if self._home is not None:
            raise ValueError(f"{_SUPPORTED}, on the loader's own shard; regroup() moved this one (its global batches "
                             "change size with the served world: skipped ranges could not be numbered)")
        if batches == 0:
            return 0
        progress = self._next_progress()
        if progress is not self._progress:
            self._switch_epoch(progress.epoch)  # the epoch the next iter() would start
            progress = self._progress
        holes = self._holes(progress)
        if holes:
            raise ValueError(
                "skip() cannot pass over batches while this pass delivered some out of order (in_order=False) "
                f"beyond its consumed prefix (batches {', '.join(map(str, holes))} are still in "
                "flight): skip between passes, or after load_state_dict / load_checkpoint"
            )
        # A rank that has served all its batches (with even_batches=False, one fewer than
        # rank 0's, perhaps) has nothing left of the epoch to skip.
        span = self._span(progress, 0 if progress.finished else batches)
        if span.steps:
            progress.batches += span.rank_batches
            progress.samples += span.rank_slots
            progress.finished = progress.batches == self._epoch_batches(progress)
            progress.delivered = None  # in_order=False: the next pass numbers its batches from the new prefix
            first = self._skips.global_batch(progress.epoch, span.first_step)
            self._skips = self._skips.adding(SkippedRange(
                progress.epoch, first, span.first_position, progress.epoch, first + span.steps,
                span.stop_position, span.steps, span.positions))
        self._resume_pending = True
        self._generation += 1
        if span.steps < batches:
            warnings.warn(
                f"ResumableDataLoader.skip({batches}) stopped at the end of epoch {progress.epoch}: "
                f"{span.steps} global batches were left in it and skipped; the next epoch is not skipped into",
                stacklevel=2,
            )
        return span.steps

    def _holes(self, progress: Progress) -> list[int]:
        """This rank's batches of the pass not handed on, below one that was (in_order=False)."""
        if self._stream is not None:
            return self._stream.holes(self)
        return progress.delivered.holes if progress.delivered is not None else []

    def _span(self, progress: Progress, steps: int) -> SkipSpan:
        if self._stream is None:
            return skip_span(progress.plan, self._layout(progress), self.rank, progress.batches, steps)
        # A stream reads past what it skips: its readers start at the new position, passing
        # over whole shards by their item counts and reading the current shard up to it.
        moved = self._stream.skip(self, progress.epoch, self.rank, steps)
        return SkipSpan(progress.batches, moved.steps, moved.rank_batches, moved.rank_items, moved.first_position,
                        moved.stop_position, moved.positions)

    def _epoch_batches(self, progress: Progress) -> int:
        if self._stream is None:
            return self._layout(progress).num_batches(self.rank)
        return self._stream.batches(self, progress, False)

    @property
    def skipped(self) -> tuple[SkippedRange, ...]:
        """The ranges `skip` passed over, oldest first, as the state records them (at most
        `MAX_SKIPPED_RANGES`: the oldest are merged), in epoch positions and global batch
        numbers. A global batch number counts the epoch's global batches before it, across
        resumes, each of the global batch size in force when it was served."""
        return self._skips.ranges

    def _skips_entry(self, state_dict: dict[str, Any]) -> None:
        if not self._skips.empty:
            state_dict[rank_key(self.rank)][SKIPS_KEY] = self._skips.to_tensor()

    def _saved_skips(self, state_dict: Mapping[str, Any], saved: SavedStates, remapped: bool) -> SkipLedger:
        """The ledger a loaded state continues; after a re-partition, its global batches are
        numbered on from the furthest saved rank's."""
        ledger = saved_ledger(state_dict, sorted(saved.ranks))
        if not remapped:
            return ledger
        epoch = saved.any.epoch
        return ledger.rebased(epoch, max(state.batches_consumed for state in saved.ranks.values()))
