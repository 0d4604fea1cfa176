"""One writer per run: the job that saves at a location holds its writer lease.

The lease is a small JSON object ``.writer_lease_<generation>`` beside the step directories,
created if absent (the commit marker's create-if-absent: a hard link on disk, a PUT with
``If-None-Match: *`` on S3). A daemon thread of the holder rewrites it every refresh period
(its heartbeat; a slow or failing store delays the thread, never the training), and a clean
exit removes it. Another job that starts saving there while the lease is alive is refused,
naming the holder. A stale lease (no heartbeat for ``STALE_PERIODS`` refresh periods, or its
process gone from this machine), or one of the same torchrun job before torchrun restarted
its workers, is taken over by creating the next generation: of two jobs taking over at
once, one creates it. ``DIST_RESUME_TAKE_OVER=1`` takes over a live lease;
the job that held it learns so at its next heartbeat and its later saves are refused.
Only rank 0 runs this; ``save_checkpoint`` hands the outcome to every rank.
"""

from __future__ import annotations

import atexit
import os
import posixpath
import re
import threading
import time

from dist_resume.checkpoint.bounded_files import read_whole
from dist_resume.checkpoint.lease_holder import LEASE_LIMIT, Holder
from dist_resume.errors import CheckpointCorruptError, CheckpointError
from dist_resume.storage import FILE, CheckpointStore

LEASE_NAME = re.compile(r"\.writer_lease_(\d{1,18})")
REFRESH_ENV = "DIST_RESUME_LEASE_REFRESH"  # seconds between heartbeats
TAKE_OVER_ENV = "DIST_RESUME_TAKE_OVER"  # "1": take over a live lease
DEFAULT_REFRESH = 30.0
_ATTEMPTS = 8  # leases that vanish or change while read, before giving up


def _lease_path(store: CheckpointStore, generation: int) -> str:
    return store.loc.join(f".writer_lease_{generation}")


def _refresh_seconds() -> float:
    text = os.environ.get(REFRESH_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_REFRESH
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise CheckpointError(f"{REFRESH_ENV}={text!r} is not a number of seconds above 0")
    return seconds


def _generations(store: CheckpointStore) -> list[int]:
    return sorted(int(match.group(1)) for entry in store.entries(store.loc.root)
                  if entry.kind == FILE and (match := LEASE_NAME.fullmatch(entry.name)))


def _current(store: CheckpointStore) -> tuple[int, Holder | None] | None:
    """The newest lease generation and its holder (None: a record naming no one); None if
    there is no lease. Raises _Vanished if the newest lease was removed while read."""
    generations = _generations(store)
    if not generations:
        return None
    generation = generations[-1]
    where = f"the writer lease at {store.loc.url}"
    try:
        data = read_whole(store.loc, _lease_path(store, generation), where, LEASE_LIMIT)
    except CheckpointCorruptError:
        if not store.exists(_lease_path(store, generation)):
            raise _Vanished from None
        return generation, None  # over the size limit: not a record
    return generation, Holder.parse(bytes(data))


class _Vanished(Exception):
    """The lease being read was released or replaced: look again."""


class Lease:
    """A lease this process holds on one location, kept alive by a daemon thread."""

    def __init__(self, store: CheckpointStore, holder: Holder, generation: int) -> None:
        self.store = store
        self.holder = holder
        self.generation = generation
        self.lost_to: str | None = None  # the job that took the lease over
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, name="dist-resume-writer-lease", daemon=True)
        self._thread.start()

    def _keep_alive(self) -> None:
        while not self._stop.wait(self.holder.refresh_seconds):
            try:
                current = _current(self.store)
                if current is not None and current[0] > self.generation:
                    holder = current[1]
                    self.lost_to = holder.describe(time.time()) if holder else "a lease record that names no job"
                    return
                self.holder = self.holder.beat()
                self.store.overwrite(_lease_path(self.store, self.generation), self.holder.encode())
            except Exception:  # noqa: BLE001 - this thread must outlive any one failed heartbeat
                # Tried again next period; a lease that stays unrefreshed goes stale, and
                # the next heartbeat that gets through finds the job that took it over.
                continue

    def require_held(self) -> None:
        """Raise if another job took this lease over."""
        if self.lost_to is not None:
            raise CheckpointError(
                f"cannot save to {self.store.loc.url}: another job took over this run's writer lease "
                f"({self.lost_to}); this job no longer writes there"
            )

    def release(self) -> None:
        """Stop the heartbeat and remove the lease, unless another job took it over."""
        self._stop.set()
        self._thread.join(timeout=self.holder.refresh_seconds)
        if self.lost_to is None:
            self.store.remove_file(_lease_path(self.store, self.generation))


def take(store: CheckpointStore) -> Lease:
    """The writer lease of ``store``'s location for this process; refused with a
    :class:`CheckpointError` naming the holder while another job's lease is alive."""
    store.require_container("save to")
    store.ensure_directory(store.loc.root)  # a run's first file: before DCP makes its directories
    take_over = os.environ.get(TAKE_OVER_ENV) == "1"
    me = Holder.this_process(_refresh_seconds())
    for _ in range(_ATTEMPTS):
        try:
            current = _current(store)
        except _Vanished:
            continue
        generation = 0
        if current is not None:
            generation, holder = current[0] + 1, current[1]
            now = time.time()
            if holder is not None and not take_over and not holder.replaceable_by(me, now):
                raise CheckpointError(
                    f"cannot save to {store.loc.url}: another job is writing there ({holder.describe(now)}); one "
                    f"job writes to a run at a time: stop that job, or wait until its lease is stale (no "
                    f"heartbeat for {holder.stale_after:g} s), or set {TAKE_OVER_ENV}=1 to take it over now"
                )
        me = me.beat()
        if store.create_exclusive(_lease_path(store, generation), me.encode()):
            for older in _generations(store):
                if older < generation:
                    store.remove_file(_lease_path(store, older))
            return Lease(store, me, generation)
    raise CheckpointError(f"cannot save to {store.loc.url}: its writer lease kept changing while this job "
                          "tried to take it (other jobs starting on the same URL?)")


_held: dict[tuple[str, str, str | None], Lease] = {}
_held_lock = threading.Lock()
_release_at_exit = []  # holds True once release_all is registered with atexit


def hold(store: CheckpointStore) -> None:
    """Make sure this process holds the writer lease of ``store``'s location: taken at the
    first save there, checked (in memory) at every later one, released at a clean exit."""
    key = store.loc.run_key  # one run however its URL is spelled
    with _held_lock:
        lease = _held.get(key)
        if lease is None:
            if not _release_at_exit:
                atexit.register(release_all)
                _release_at_exit.append(True)
            _held[key] = take(store)
            return
    lease.require_held()


def release_all() -> None:
    """Release every lease this process holds (at exit; a job may call it when done)."""
    with _held_lock:
        leases = list(_held.values())
        _held.clear()
    for lease in leases:
        try:
            lease.release()
        except CheckpointError:
            pass  # the lease goes stale on its own
