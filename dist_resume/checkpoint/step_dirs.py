"""Where a run's checkpoints live under its URL, read literally.

``<url>/step_00000100/.committed`` (JSON) commits step 100; the data of the save that won
the commit is in ``<url>/step_00000100/attempt_<id>/``, a directory no other save writes
(steps saved before attempts had directories hold their data in the step directory). A
location holds nothing, or checkpoints, or something this library refuses to guess about.
"""

from __future__ import annotations

import posixpath
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from dist_resume.checkpoint.marker import ATTEMPT_NAME, ATTEMPT_PREFIX, read_marker
from dist_resume.checkpoint.metadata_checks import METADATA
from dist_resume.errors import CheckpointError
from dist_resume.storage import DIRECTORY, FILE, LINK, CheckpointStore

MARKER = ".committed"
_STEP_DIR = re.compile(r"step_(\d+)", re.ASCII)
_PARALLEL_READS = 16  # a run's markers are small reads: their latency, not bandwidth, adds up


class Commit(NamedTuple):
    """A committed step: its directory, its commit marker, and the directory of the data it commits."""

    step: int
    directory: str
    marker: dict[str, Any]
    data: str


def step_dir_name(step: int) -> str:
    """Directory name of ``step``; zero-padded so that names sort like steps."""
    return f"step_{step:08d}"


def step_dir(store: CheckpointStore, step: int) -> str:
    return store.loc.join(step_dir_name(step))


def require_directory(store: CheckpointStore, directory: str, kind: str | None) -> None:
    """Refuse a step directory of ``kind`` that is there but is not a directory: a link
    would lead reads and writes outside the run."""
    if kind not in (None, DIRECTORY):
        what = "a symbolic link" if kind == LINK else "not a directory"
        raise CheckpointError(f"{store.loc.url_of(directory)} is {what}; step directories "
                              "must be directories written by save_checkpoint")


def step_directories(store: CheckpointStore) -> dict[int, str]:
    """The step directories at the location, committed or not, by step (one listing). One
    that is a link or not named as this library names it is refused, never read beside the others."""
    loc = store.loc
    steps = {}
    for entry in store.entries(loc.root):
        match = _STEP_DIR.fullmatch(entry.name)
        if not match:
            continue
        step = int(match.group(1))
        if entry.name != step_dir_name(step):
            raise CheckpointError(
                f"{loc.url} holds {entry.name}, which is not how dist-resume names step {step} "
                f"({step_dir_name(step)}); rename or remove it"
            )
        directory = loc.join(entry.name)
        require_directory(store, directory, entry.kind)
        steps[step] = directory
    return steps


def read_commit(store: CheckpointStore, step: int, directory: str) -> Commit | None:
    """What decides whether ``step`` is committed, for every reader (load, list, inspect,
    keep=): its commit marker, each field checked. None if it has none: the step does not
    exist (G7); a damaged marker is one :class:`CheckpointCorruptError`."""
    marker = read_marker(store.loc, posixpath.join(directory, MARKER), step, f"step {step} at {store.loc.url}")
    if marker is None:
        return None
    attempt = marker.get("attempt")
    return Commit(step, directory, marker, directory if attempt is None else posixpath.join(directory, attempt))


def newest_commit(store: CheckpointStore, steps: dict[int, str]) -> Commit | None:
    """The commit of the newest committed step of ``steps`` (`step_directories`), None if none
    is: a marker read per step, newest first, until one is there."""
    for step in sorted(steps, reverse=True):
        found = read_commit(store, step, steps[step])
        if found is not None:
            return found
    return None


def marker_tags(store: CheckpointStore) -> dict[int, str]:
    """The tag of each step directory's marker by step (`CheckpointStore.tags`: from listings
    of the step directories, their attempts rolled up); none where storage offers no tags."""
    return _marker_tags(store) or {}


def _marker_tags(store: CheckpointStore) -> dict[int, str] | None:
    listed = store.tags(store.loc.join("step_"), f"/{ATTEMPT_PREFIX}")
    if listed is None:
        return None
    found = {}
    for path, tag in listed.items():
        name, _, rest = path.partition("/")
        match = _STEP_DIR.fullmatch(name)
        if match and rest == MARKER and name == step_dir_name(int(match.group(1))):
            found[int(match.group(1))] = tag
    return found


def marked_steps(store: CheckpointStore, steps: dict[int, str]) -> set[int]:
    """The steps of ``steps`` (`step_directories`) whose directories hold a commit marker,
    read or not: the steps no save can take any more, a damaged marker's included. From the
    markers' tags where storage lists them (S3: one listing per 1,000 steps), else a check
    per step (in parallel); no marker is read."""
    tagged = _marker_tags(store)
    if tagged is not None:
        return tagged.keys() & steps.keys()
    ordered = sorted(steps)
    with ThreadPoolExecutor(_PARALLEL_READS) as pool:
        there = pool.map(lambda step: store.exists(posixpath.join(steps[step], MARKER)), ordered)
        return {step for step, marked in zip(ordered, there) if marked}


def commits(store: CheckpointStore, steps: dict[int, str]) -> list[Commit]:
    """The commits of every committed step of ``steps``, oldest first (their markers read in parallel)."""
    with ThreadPoolExecutor(_PARALLEL_READS) as pool:
        found = pool.map(lambda step: read_commit(store, step, steps[step]), sorted(steps))
        return [commit for commit in found if commit is not None]


def refuse_misplaced(store: CheckpointStore) -> None:
    """For a location without committed steps: return if it holds nothing this library
    could have meant (absent, empty, other files, saves that never committed); raise with
    the URL to give instead if it is a step, an attempt, a DCP checkpoint or a file."""
    loc = store.loc
    kind = store.kind(loc.root, follow_links=True)  # a run may live behind a link; its steps may not
    if kind is None:
        store.require_container("read checkpoints at")
        return
    name = posixpath.basename(loc.root)
    if kind != DIRECTORY:
        if name in (METADATA, MARKER) or name.endswith(".distcp"):
            raise CheckpointError(f"{loc.url} is a file of a checkpoint; give the URL of the run that holds "
                                  f"its step directories, not a file in one")
        what = "a symbolic link" if kind == LINK else "a file" if kind == FILE else "not a directory"
        raise CheckpointError(f"{loc.url} is {what}, not a checkpoint location (a directory or prefix)")
    names = {entry.name for entry in store.entries(loc.root)}
    up = posixpath.dirname(loc.url.rstrip("/"))
    if ATTEMPT_NAME.fullmatch(name):
        raise CheckpointError(f"{loc.url} is one save's directory inside a step; give the run's URL "
                              f"{posixpath.dirname(up)}")
    if _STEP_DIR.fullmatch(name) and names & {MARKER, METADATA} or any(ATTEMPT_NAME.fullmatch(n) for n in names):
        raise CheckpointError(f"{loc.url} is a step directory; give the run's URL {up}")
    if METADATA in names or any(n.endswith(".distcp") for n in names):
        raise CheckpointError(
            f"{loc.url} holds a checkpoint written by torch.distributed.checkpoint directly, without "
            "save_checkpoint's commit; load it with torch.distributed.checkpoint.load, or give the URL "
            "save_checkpoint wrote to"
        )
    below = runs_below(store, loc.root)
    if below:
        which = ", ".join(loc.url_of(path) for path in below)
        raise CheckpointError(f"{loc.url} holds no committed step, but {which} "
                              f"{'does' if len(below) == 1 else 'do'}: give the URL of the run to load")


# Directories looked into below a location without steps: a URL one or two levels too high
# (a job's run folder, the folder of all runs) is found; a deep tree is not walked.
_DEPTH, _BREADTH = 2, 32


def runs_below(store: CheckpointStore, path: str, depth: int = _DEPTH) -> list[str]:
    """Directories up to ``depth`` levels below ``path`` that hold committed steps (the
    first ``_BREADTH`` subdirectories of each, by name)."""
    subdirectories = sorted(entry.name for entry in store.entries(path) if entry.kind == DIRECTORY)
    found = []
    for name in subdirectories[:_BREADTH]:
        below = posixpath.join(path, name)
        if _holds_committed_steps(store, below):
            found.append(below)
        elif depth > 1:
            found += runs_below(store, below, depth - 1)
    return found


def _holds_committed_steps(store: CheckpointStore, path: str) -> bool:
    return any(_STEP_DIR.fullmatch(entry.name) and entry.kind == DIRECTORY
               and store.exists(posixpath.join(path, entry.name, MARKER)) for entry in store.entries(path))
