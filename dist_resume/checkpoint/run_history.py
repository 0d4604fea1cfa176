"""What this job saw of each run it loaded from or saved to, so that a save that finds its
step already committed says by whom (G10): this job, the run as it stood when this job came
to it (when it loaded, or at its first save there without a load), or another job that
wrote the run since. Kept in the process of rank 0, which commits; a job is its processes."""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from dist_resume.checkpoint.step_dirs import marked_steps, read_commit, step_dir, step_directories
from dist_resume.errors import CheckpointError, CheckpointExistsError
from dist_resume.storage import CheckpointStore, Location


@dataclass
class _Run:
    found: frozenset[int]  # the steps committed when this job came to the run
    loaded: int | None  # the step this job loaded; None if it loaded none
    by_load: bool  # whether it came by a load (else by its first save)
    attempts: set[str] = field(default_factory=set)  # the directories of this job's saves
    committed: set[int] = field(default_factory=set)  # the steps this job committed


_runs: dict[tuple[str, str, str | None], _Run] = {}
_lock = threading.Lock()


def note_load(loc: Location, step: int | None, committed: Iterable[int]) -> None:
    """This job loaded ``step`` (None: the run held no committed step) from ``loc``, where
    ``committed`` were the committed steps."""
    with _lock:
        previous = _runs.get(loc.run_key)
        run = _Run(frozenset(committed), step, by_load=True)
        if previous is not None:
            run.attempts, run.committed = previous.attempts, previous.committed
        _runs[loc.run_key] = run


def note_arrival(store: CheckpointStore) -> None:
    """Before a save looks for its step: at this job's first save to a run it did not load
    from, remember the steps committed there."""
    with _lock:
        if store.loc.run_key in _runs:
            return
    found = frozenset(_committed_at(store))  # outside the lock: storage requests
    with _lock:
        _runs.setdefault(store.loc.run_key, _Run(found, None, by_load=False))


def note_attempt(loc: Location, attempt: str) -> None:
    """This job's save writes into ``attempt`` (a step's commit marker names it)."""
    with _lock:
        _runs[loc.run_key].attempts.add(posixpath.basename(attempt))


def note_commit(loc: Location, step: int) -> None:
    with _lock:
        _runs[loc.run_key].committed.add(step)


def step_taken(store: CheckpointStore, step: int, outcome: str) -> CheckpointExistsError:
    """The error of a save that finds ``step`` committed at ``store``: by this job, before
    this job came to the run, or by another job since. ``outcome``: what became of the save."""
    url = store.loc.url
    with _lock:
        run = _runs.get(store.loc.run_key)
    if run is None:  # never: a save notes its arrival first
        return CheckpointExistsError(f"step {step} is already committed at {url}; a committed checkpoint is "
                                     "never overwritten")
    if step in run.committed or _attempt_of(store, step) in run.attempts:
        return CheckpointExistsError(
            f"step {step} is already committed at {url} by this job (an earlier save of step {step} committed "
            f"it, even if that save raised); a committed checkpoint is never overwritten: give each save a new step"
        )
    if step in run.found:
        if run.by_load:
            return CheckpointExistsError(
                f"step {step} is already committed at {url}: it was committed before this job loaded step "
                f"{run.loaded} there (the newest committed step then was {max(run.found)}); a committed checkpoint "
                f"is never overwritten: save steps after {max(run.found)}, or save into another URL"
            )
        return CheckpointExistsError(
            f"step {step} is already committed at {url}: it was committed before this job's first save there, "
            "and this job loaded nothing from this run; a committed checkpoint is never overwritten: to continue "
            "the run, load_checkpoint first and count steps on from the step it returns; to start a new run, "
            "save into another URL"
        )
    since = ("this job's first save there" if not run.by_load else
             "this job found no committed step there" if run.loaded is None else
             f"this job loaded step {run.loaded} there")
    others = sorted((_committed_now(store) | {step}) - run.found - run.committed)
    return CheckpointExistsError(
        f"cannot save step {step} at {url}: another job committed it. Two jobs wrote this run: since {since}, "
        f"another job committed {_listed(others)}. {outcome}, and the committed steps are unchanged. Stop the "
        "other job (a launcher killed with kill -9 leaves workers running that do not end with it: see "
        "docs/operations.md), then start this job again: it resumes from the newest committed step"
    )


def _attempt_of(store: CheckpointStore, step: int) -> str | None:
    """The save directory that ``step``'s commit marker names; None if it cannot be read."""
    try:
        found = read_commit(store, step, step_dir(store, step))
    except CheckpointError:
        return None
    return None if found is None else found.marker.get("attempt")


def _committed_now(store: CheckpointStore) -> set[int]:
    try:
        return _committed_at(store)
    except CheckpointError:  # the error being raised says what it can without the listing
        return set()


def _committed_at(store: CheckpointStore) -> set[int]:
    """The steps committed at ``store``'s location now, as a save finds them: those whose marker exists."""
    return marked_steps(store, step_directories(store))


def _listed(steps: list[int], shown: int = 8) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) <= shown:
        return f"steps {', '.join(map(str, steps))}"
    return f"steps {', '.join(map(str, steps[:shown - 2]))}, ..., {steps[-1]} ({len(steps)} steps)"
