"""The files of a run's writer lease: ``.writer_lease_<generation>`` beside the step
directories, one per job that took the lease, each a regular file written by that job only.

A generation is a decimal number of any length, compared and counted as text (no width to
overflow). The library never removes a generation: a job takes the lease by creating the
successor of the newest one if absent, so no name is ever created twice, and a job whose
lease was taken over finds its successor for as long as the run exists. Any other name that
starts like a lease, or a lease that is not a regular file, is refused by name: a job that
ignored it could not tell whether another job writes there.
"""

from __future__ import annotations

import re

from dist_resume.checkpoint.bounded_files import read_whole
from dist_resume.checkpoint.lease_holder import LEASE_LIMIT
from dist_resume.errors import CheckpointCorruptError, CheckpointError, UnsafeCheckpointError
from dist_resume.storage import DIRECTORY, FILE, LINK, CheckpointStore, private_write_target, retry

PREFIX = ".writer_lease_"
_GENERATION = re.compile(r"0|[1-9][0-9]*", re.ASCII)
_REMOVE = "this job cannot tell whether another job writes there: remove it once no job writes to this run"


def successor(generation: str) -> str:
    """The generation after ``generation`` (decimal text, incremented as text)."""
    kept = generation.rstrip("9")
    carried = len(generation) - len(kept)
    if not kept:
        return "1" + "0" * carried
    return kept[:-1] + str(int(kept[-1]) + 1) + "0" * carried


def _newer(generation: str) -> tuple[int, str]:
    return len(generation), generation  # canonical decimal text: longer is larger


class LeaseFiles:
    """The lease files of the run at ``store``'s location."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.url = store.loc.url

    def path(self, generation: str) -> str:
        return self.store.loc.join(PREFIX + generation)

    def generations(self) -> list[str]:
        """Every generation in the run's folder, oldest first; raises a CheckpointError
        naming any entry that starts like a lease but is not one."""
        found = []
        for entry in self.store.entries(self.store.loc.root):
            if not entry.name.startswith(PREFIX):
                continue
            target = private_write_target(entry.name)
            if target is not None and _GENERATION.fullmatch(target[len(PREFIX):]):
                continue  # a local write in progress, or one a crash left behind
            generation = entry.name[len(PREFIX):]
            if not _GENERATION.fullmatch(generation):
                raise CheckpointError(
                    f"cannot save to {self.url}: its folder holds {entry.name!r}, which is not a writer lease (those "
                    f"are regular files named {PREFIX}<generation>, a decimal number without leading zeros); {_REMOVE}"
                )
            if entry.kind != FILE:
                raise self._not_a_file(entry.name, entry.kind)
            found.append(generation)
        return sorted(found, key=_newer)

    def _not_a_file(self, name: str, kind: str | None) -> CheckpointError:
        what = {LINK: "a symbolic link", DIRECTORY: "a directory"}.get(kind or "", "a FIFO, a device or a socket")
        return CheckpointError(
            f"cannot save to {self.url}: its writer lease {name} is {what}, not a regular file (dist-resume writes its "
            f"lease as a regular file and never through a link); {_REMOVE}"
        )

    def newest(self) -> tuple[str, bytes | None] | None:
        """The newest generation and its record's bytes (None if it vanished, or is too large
        to be a record); None if the run has no lease."""
        generations = self.generations()
        if not generations:
            return None
        return generations[-1], self.read(generations[-1])

    def read(self, generation: str) -> bytes | None:
        """The record of ``generation``, one whole version of it (its holder replaces it at
        every heartbeat); None if there is none, or it is too large to be one."""
        path = self.path(generation)
        loc = self.store.loc
        if not loc.is_local:
            # One ranged GET: a size and the bytes read apart could come from two versions.
            try:
                data = retry(loc.fs.cat_file, path, start=0, end=LEASE_LIMIT + 1)
            except FileNotFoundError:
                return None
            except Exception as exc:
                raise loc.error("read", path, exc) from None
            return bytes(data) if len(data) <= LEASE_LIMIT else None
        try:  # reads the file it opened: a version replaced meanwhile is not mixed in
            return bytes(read_whole(loc, path, f"the writer lease at {self.url}", LEASE_LIMIT))
        except CheckpointCorruptError:
            return None  # missing, or over the size limit: no record either way
        except UnsafeCheckpointError:  # a link leading out of the run, a FIFO, a directory...
            raise self._not_a_file(PREFIX + generation, self.store.kind(path)) from None

    def present(self, generation: str) -> bool:
        """Whether anything at all stands under the name of ``generation``."""
        return self.store.kind(self.path(generation)) is not None

    def create(self, generation: str, data: bytes) -> bool:
        """Create ``generation`` holding ``data`` if nothing is there; True if this call did."""
        return self.store.create_exclusive(self.path(generation), data)

    def overwrite(self, generation: str, data: bytes) -> None:
        """Replace the record of ``generation``, which only the job that created it writes."""
        self.store.overwrite(self.path(generation), data)
