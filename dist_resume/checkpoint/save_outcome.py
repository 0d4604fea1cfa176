"""What a save that lost a peer rank can truthfully say of its step (G7)."""

from __future__ import annotations

import posixpath

from dist_resume.checkpoint.marker import read_marker
from dist_resume.checkpoint.step_dirs import MARKER, step_dir
from dist_resume.errors import CheckpointError
from dist_resume.storage import CheckpointStore


class SaveOutcome:
    """Whether one save's step is committed, as far as this rank can tell once a peer is lost.

    Rank 0 commits alone, and only after every rank has entered the barrier before the commit:
    a peer lost before this rank entered it means this save committed nothing. After that,
    the step's commit marker tells; on a rank other than 0 only as of the look, since rank 0,
    if it is still running, may commit the step later.
    """

    def __init__(self, store: CheckpointStore, step: int, rank: int) -> None:
        self._store, self._step, self._rank = store, step, rank
        self._attempt: str | None = None

    def entering_commit(self, attempt: str) -> None:
        """This rank enters the barrier after which rank 0 may commit ``attempt``."""
        self._attempt = attempt

    def peer_lost(self) -> str:
        """The start of the error of this save once a peer rank is lost, saying whether the
        step is committed: "cannot save step 5 at URL, which is not committed", or "step 5 at
        URL is committed, but the save did not end on every rank"."""
        where = f"step {self._step} at {self._store.loc.url}"
        if self._attempt is None:
            return f"cannot save {where}, which is not committed"
        marker = posixpath.join(step_dir(self._store, self._step), MARKER)
        try:
            committed = self._store.exists(marker)
            attempt = read_marker(self._store.loc, marker, self._step, where).get("attempt") if committed else None
        except CheckpointError as exc:
            return f"cannot save {where}, and whether it is committed could not be read ({type(exc).__name__}: {exc})"
        if committed and attempt == posixpath.basename(self._attempt):
            return f"{where} is committed, but the save did not end on every rank"
        if committed:
            return f"cannot save {where}: another save committed that step, with its own data"
        if self._rank == 0:
            return f"cannot save {where}, which is not committed"
        return (f"cannot save {where}, which was not committed when this rank looked (rank 0 commits "
                "alone and, if it is still running, may yet commit it)")
