"""``save_checkpoint``: atomic, sharded DCP saves at any fsspec URL (G7, G9).

Each save writes DCP's files into a directory of its own; once every rank's files are
stored, rank 0 commits the step by creating its ``.committed`` marker if no other save did
(see ``commit``). Only committed steps exist for loading and listing.
"""

from __future__ import annotations

from concurrent.futures import Future
from contextlib import nullcontext
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from dist_resume.arguments import checked_flag, checked_int, checked_url
from dist_resume.checkpoint.async_saves import SaveHandle, start, wait_for_previous_save
from dist_resume.checkpoint.collectives import (checkpoint_group, dcp_call, distributed, on_rank0, peers_answer,
                                                single_process_intended)
from dist_resume.checkpoint.commit import commit, prepare_attempt
from dist_resume.checkpoint.lease import confirm as confirm_lease
from dist_resume.checkpoint.lease import hold as hold_lease
from dist_resume.checkpoint.rank_agreement import require_agreement
from dist_resume.checkpoint.rank_tables import taken_states, with_rank_tables
from dist_resume.checkpoint.save_outcome import SaveOutcome
from dist_resume.checkpoint.split_metadata import SplitMetadataWriter
from dist_resume.errors import CheckpointError
from dist_resume.state.fields import ResumeStateError
from dist_resume.state.skips import loader_skips
from dist_resume.storage import CheckpointStore, guarded, open_store, resolve


def _begin(store: CheckpointStore, step: int) -> str:
    """Rank 0: the new directory of this save, once this job holds the run's writer lease."""
    attempt = prepare_attempt(store, step)
    hold_lease(store)
    return attempt


def _commit(store: CheckpointStore, step: int, attempt: str, keep: int | None, world_size: int) -> list[str]:
    """Rank 0: commit, unless another job took this job's writer lease over during the save;
    what failed after the commit (see ``commit``)."""
    confirm_lease(store)
    return commit(store, step, attempt, keep, world_size)


def _finish(store: CheckpointStore, step: int, attempt: str, keep: int | None,
            group: dist.ProcessGroup | None, outcome: SaveOutcome) -> None:
    world_size = dist.get_world_size(group) if distributed() else 1
    outcome.entering_commit(attempt)
    try:
        if distributed():
            dist.barrier(group=group)  # every rank's data is stored
        afterwards = on_rank0(group, lambda: _commit(store, step, attempt, keep, world_size))
    except Exception as failure:  # noqa: BLE001 - settled by the marker
        outcome.settle(failure, group)
        return
    outcome.committed(afterwards)


def _finish_async(upload: Future, store: CheckpointStore, step: int, attempt: str, keep: int | None,
                  group: dist.ProcessGroup | None, where: str, outcome: SaveOutcome) -> int:
    with peers_answer(outcome.peer_lost, group):
        dcp_call(store.loc, "saving", where, upload.result)
        _finish(store, step, attempt, keep, group, outcome)
    return step


def save_checkpoint(
    state: dict[str, Any],
    url: str,
    step: int,
    *,
    keep: int | None = None,
    async_save: bool = False,
    storage_options: dict[str, Any] | None = None,
    process_group: dist.ProcessGroup | None = None,
) -> SaveHandle | None:
    """Save ``state`` (a DCP state dict; Stateful entries welcome) as ``step`` under ``url``.

    Collective: every rank of ``process_group`` calls it with the same URL, ``step``,
    ``keep`` and ``async_save``; ranks that differ all raise one :class:`CheckpointError`
    naming the argument and each rank's value, before anything is written; so do ranks
    whose data loaders skipped different batches (``loader.skip``). The step is
    written to a new directory and committed only after every rank's data and DCP's
    ``.metadata`` are stored; a crash at any point leaves the previous committed step
    loadable (G7). A committed step is never overwritten (:class:`CheckpointExistsError`).
    With ``keep=K``, older committed steps beyond the newest K are deleted after the commit.

    With ``async_save=True`` the state is copied to memory, written in the background over
    a gloo group of its own, and a :class:`SaveHandle` is returned; a new save first waits
    for the previous one.
    """
    storage_options = guarded(storage_options)  # secrets never shown in captured locals
    step = checked_int("step", step, 0)
    keep = None if keep is None else checked_int("keep", keep, 1)
    async_save = checked_flag("async_save", async_save)
    loc = resolve(checked_url(url), storage_options)
    store = open_store(loc)
    wait_for_previous_save()
    where = f"step {step} at {loc.url}"
    outcome = SaveOutcome(store, step, dist.get_rank(process_group) if distributed() else 0)
    with peers_answer(outcome.peer_lost, process_group):
        try:
            skipped = loader_skips(state)
            state, refusal = taken_states(state), None
        except (CheckpointError, ResumeStateError) as exc:  # raised on every rank by the agreement, not on one
            skipped, refusal = {}, str(exc)
        # before the background group exists: creating it is a collective of its own, and a
        # rank that creates it while its peer does not waits forever
        require_agreement(loc, process_group, "save", skipped=skipped, refusal=refusal, step=step, keep=keep,
                          async_save=async_save)
        group = checkpoint_group(process_group) if async_save else process_group
        attempt = on_rank0(group, lambda: _begin(store, step))
        state = with_rank_tables(state, group)
        writer = SplitMetadataWriter(loc, attempt)
        if not async_save:
            dcp_call(loc, "saving", where, dcp.save, state, storage_writer=writer, process_group=group)
            _finish(store, step, attempt, keep, group, outcome)
            return None
        alone = not distributed()
        with single_process_intended() if alone else nullcontext():
            upload = dcp_call(loc, "saving", where, dcp.async_save, state, storage_writer=writer,
                              process_group=group)
            if alone:  # DCP's upload thread warns of a single process as it begins: wait for that
                upload.add_done_callback(lambda _: writer.begun.set())
                writer.begun.wait()
    return start(step, _finish_async, upload, store, step, attempt, keep, group, where, outcome)
