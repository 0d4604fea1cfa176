"""A save's outcome is one fact (G7): its step's commit marker, naming this save's files.
A save returns only if that marker exists, whatever failed after it was created (indexing,
pruning, a peer rank lost before it learned the outcome: a warning that says the step is
committed), and raises only if it does not. A rank that cannot tell, because storage stops
answering or because rank 0 (which commits alone) may still commit after this rank lost it,
raises :class:`SaveOutcomeUnknownError`, which says so (G10). Every rank settles its own save
by this rule."""

from __future__ import annotations

import posixpath
import warnings

import torch.distributed as dist

from dist_resume.checkpoint.step_dirs import Commit, read_commit, step_dir
from dist_resume.errors import CheckpointError, SaveOutcomeUnknownError
from dist_resume.process_group import peer_failure
from dist_resume.storage import CheckpointStore


def unknown_outcome(where: str, what_failed: str, failure: BaseException,
                    unread: CheckpointError) -> SaveOutcomeUnknownError:
    """The error of a save of ``where`` that failed as ``what_failed`` says (``failure``) and
    could not read its commit marker then (``unread``)."""
    if isinstance(failure, SaveOutcomeUnknownError):
        return failure
    return SaveOutcomeUnknownError(f"whether {where} is committed is not known: {what_failed} ({failure}) and "
                                   f"reading its commit marker failed too ({unread}); list_checkpoints tells once "
                                   "storage answers")


class SaveOutcome:
    """The outcome of one save of ``step`` on this rank (``rank`` of its group).

    Rank 0 commits alone, and only after every rank has entered the barrier before the
    commit: a failure before this rank entered it means this save committed nothing. After
    that, the step's marker decides (`settle`).
    """

    def __init__(self, store: CheckpointStore, step: int, rank: int) -> None:
        self._store, self._step, self._rank = store, step, rank
        self._where = f"step {step} at {store.loc.url}"
        self._attempt: str | None = None

    def entering_commit(self, attempt: str) -> None:
        """This rank enters the barrier after which rank 0 may commit ``attempt``."""
        self._attempt = attempt

    def committed(self, afterwards: list[str]) -> None:
        """This save committed its step; rank 0 says what failed ``afterwards`` (`commit.commit`),
        each in a warning of its own (where that failed: on rank 0)."""
        if self._rank == 0:
            for what in afterwards:
                self._committed_but(what)

    def peer_lost(self) -> str:
        """The start of the error of this save when a peer rank is lost before this rank
        entered the commit (this save committed nothing): "cannot save step 5 at URL, which
        is not committed", or that another save committed it."""
        try:
            found = self._look()
        except CheckpointError as exc:
            return (f"cannot save {self._where}; this save committed nothing (whether another save committed that "
                    f"step could not be read: {type(exc).__name__}: {exc})")
        return self._not_committed_by_this_save(found)

    def settle(self, failure: Exception, group: dist.ProcessGroup | None) -> None:
        """This rank's save failed with ``failure`` after it entered the commit (``group``: the
        save's process group): return, warning what failed, if this save's marker exists;
        else raise what is true of the step."""
        try:
            found = self._look()
        except CheckpointError as unread:
            raise unknown_outcome(self._where, f"this rank saw {type(failure).__name__}", failure, unread) from None
        lost = not isinstance(failure, CheckpointError)  # the library's own errors are never a lost peer
        if found is not None and found.marker.get("attempt") == posixpath.basename(self._attempt or ""):
            said = (lost and peer_failure(failure, "the save did not end on every rank", group)) or \
                f"this rank then saw {type(failure).__name__}: {self._store.loc.redact(str(failure))}"
            self._committed_but(said)
            return
        if found is None and self._rank != 0:
            what = (f"whether {self._where} is committed is not known to this rank: it was not committed when this "
                    "rank looked, and rank 0, which commits alone, may yet commit it if it is still running "
                    "(list_checkpoints tells)")
            said = lost and peer_failure(failure, what, group)
            if said:
                raise SaveOutcomeUnknownError(said) from None
        said = lost and peer_failure(failure, self._not_committed_by_this_save(found), group)
        if said:
            raise CheckpointError(said) from None
        raise failure

    def _committed_but(self, what: str) -> None:
        # After everything else: a warning turned into an error (-W error) is then all that is raised.
        warnings.warn(f"{self._where} is committed, but {what}", stacklevel=5)

    def _look(self) -> Commit | None:
        return read_commit(self._store, self._step, step_dir(self._store, self._step))

    def _not_committed_by_this_save(self, found: Commit | None) -> str:
        if found is None:
            return f"cannot save {self._where}, which is not committed"
        return f"cannot save {self._where}: another save committed that step, with its own data"
