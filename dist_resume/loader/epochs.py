"""Which epoch a `ResumableDataLoader` serves next, and what starting one resets."""

from __future__ import annotations

import warnings

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.loader.progress import Progress
from dist_resume.positions.elastic_plan import Plan
from dist_resume.positions.layout import TailMode
from dist_resume.state.fields import Sampling
from dist_resume.streams.sharded import ShardedStream


def is_last(epoch: int) -> bool:
    """Whether ``epoch`` has no epoch after it: epochs are saved as int64."""
    return epoch + 1 >= INT64_LIMIT


def following(epoch: int) -> int:
    """The epoch after ``epoch``. Epochs are saved as int64: 2**63 - 1 has none."""
    if is_last(epoch):
        raise ValueError(f"epoch {epoch} is the last one a loader serves (epochs are saved as int64); "
                         "set_epoch() an earlier one")
    return epoch + 1


class EpochChoice:
    """The epoch methods of `ResumableDataLoader` (a mixin over the loader's position:
    `_progress`, `_plan_values`, `_dataset_length`, `_resume_pending`, `_generation`, and
    its `_layout`)."""

    @property
    def epoch(self) -> int:
        """The epoch the next `iter()` serves: the one in progress, the next once the last
        batch of the current one was consumed, or a loaded state's (a finished one's pass
        yields no batches)."""
        return self._next_progress().epoch

    def set_epoch(self, epoch: int) -> None:
        """Serve `epoch` at the next `iter()` from its start, like `DistributedSampler.set_epoch`,
        except the epoch of a state just loaded by `load_state_dict`, which keeps its loaded
        position: a resumed loop may call it unconditionally.
        Any integer type is taken (a numpy or 0-d tensor integer); one outside [0, 2**63)
        or a float is refused here, not at the next `iter()`."""
        epoch = checked_int("epoch", epoch, 0, INT64_LIMIT)
        self._forward_epoch(epoch)
        progress = self._progress
        if epoch == progress.epoch and (self._resume_pending or not progress.started):
            progress.chosen = True  # a loaded state's position, even the end of the epoch
            return
        if progress.batches and not progress.finished:
            done = f"epoch {progress.epoch} after {progress.batches} batches"
            warnings.warn(
                f"ResumableDataLoader.set_epoch({epoch}) abandons {done}; its remaining samples are skipped"
                if epoch != progress.epoch else
                f"ResumableDataLoader.set_epoch({epoch}) restarts {done}, as DistributedSampler.set_epoch "
                "does; they are served again",
                stacklevel=2,
            )
        self._switch_epoch(epoch)
        self._progress.chosen = True

    def _pass_ended(self) -> None:
        """The loader stands at the start of the next epoch; after the last epoch there is,
        at its end (the next `iter()` refuses to go on)."""
        if is_last(self._progress.epoch):
            self._progress.finished = True
        else:
            self._switch_epoch(self._progress.epoch + 1)

    def _plan_for(self, epoch: int) -> Plan:
        values = self._plan_values
        if values and values[0] == epoch:
            return Plan.decode(values, self._dataset_length, self._mode, epoch)
        return Plan(self._dataset_length, self._mode, epoch)

    def _current_length(self) -> int:
        # Read at the start of every pass: a dataset may grow between epochs.
        return self._stream.length if self._stream is not None else len(self.dataset)

    def _switch_epoch(self, epoch: int) -> None:
        self._resume_pending = False
        self._dataset_length = self._current_length()
        self._progress = Progress(epoch, self._plan_for(epoch))
        self._sampler_snapshot = None
        self._sampler_rng.reset()
        if self._stream is not None:
            self._stream.start_epoch()
        self._generation += 1

    def _next_progress(self) -> Progress:
        progress = self._progress
        if self._resume_pending or progress.chosen:
            return progress
        if progress.finished:
            if is_last(progress.epoch):
                return progress  # the last epoch there is: the next iter() refuses to go on
            epoch = progress.epoch + 1
        elif not progress.started:
            epoch = progress.epoch
        else:
            return progress  # the epoch in progress (a new iter() would start the next one)
        length = self._current_length()
        return Progress(epoch, self._plan_for(epoch) if length == self._dataset_length else Plan(length, self._mode, epoch))

    def _forward_epoch(self, epoch: int) -> None:
        for target in (self.dataset, self._user_sampler):
            set_epoch = getattr(target, "set_epoch", None)
            if callable(set_epoch) and not isinstance(target, ShardedStream):
                set_epoch(epoch)

    def padding_positions(self, epoch: int | None = None) -> list[int]:
        """Positions of `epoch`'s order (default: the current) that this rank's final batch
        repeats as padding (G2, `drop_last=False, even_batches=True`); [] if none."""
        progress = self._next_progress()
        if epoch is not None and epoch != progress.epoch:
            progress = Progress(epoch, self._plan_for(epoch))
        if self._sampling is not Sampling.EPOCH_ORDER or self._mode is not TailMode.PAD:
            return []
        layout = self._layout(progress)
        last = layout.num_batches(self.rank) - 1
        if last < 0:
            return []
        batch = layout.batch(self.rank, last)
        return [(batch.padding_start + i) % self._dataset_length for i in range(batch.padding)]
