"""One writer per run: the job that saves at a location holds its writer lease (G7).

The lease is the newest of the run's ``.writer_lease_<generation>`` files (``lease_files``),
a small JSON record naming its job. A job takes it by creating the next generation if
absent (the commit marker's create-if-absent: a hard link on disk, a PUT with
``If-None-Match: *`` on S3), so of any number of jobs racing for it exactly one creates it,
and no generation is ever created twice. A daemon thread of the holder rewrites its record
every refresh period (its heartbeat; a slow or failing store delays the thread, never the
training), and a clean exit marks it released.

Another job's lease is taken over at once if it is released, names no job (damaged: said
in a warning), is the same torchrun job's (torchrun restarted its workers) or its process is
gone from this machine; else this job watches it (``lease_watch``): seen changing, it is
alive and the save is refused naming its job; seen unchanged for ``STALE_PERIODS`` of its
refresh periods, it is stale and taken over. ``DIST_RESUME_TAKE_OVER=1`` takes over the
lease this job found (said in a warning naming its job).

A job whose lease was taken over finds its successor at every later heartbeat and before
every save and every commit, and never writes again. Only rank 0 runs this;
``save_checkpoint`` hands the outcome to every rank.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings

from dist_resume.checkpoint.lease_files import PREFIX, LeaseFiles, successor
from dist_resume.checkpoint.lease_holder import MAX_REFRESH, Holder
from dist_resume.checkpoint.lease_watch import Look, Verdict, Watch
from dist_resume.errors import CheckpointError
from dist_resume.storage import CheckpointStore

REFRESH_ENV = "DIST_RESUME_LEASE_REFRESH"  # seconds between heartbeats
TAKE_OVER_ENV = "DIST_RESUME_TAKE_OVER"  # "1": take over a live lease
DEFAULT_REFRESH = 30.0
_ATTEMPTS = 8  # generations another job created just before this one could, before giving up
_LOOKS_PER_PERIOD = 4  # looks at a watched lease per refresh period of its holder
_MAX_LOOK_INTERVAL = 5.0  # seconds


def _refresh_seconds() -> float:
    text = os.environ.get(REFRESH_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_REFRESH
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_REFRESH:
        raise CheckpointError(f"{REFRESH_ENV}={text!r} is not a number of seconds above 0 and at most {MAX_REFRESH:g}")
    return seconds


class Lease:
    """A lease this process holds on one location, kept alive by a daemon thread."""

    def __init__(self, files: LeaseFiles, holder: Holder, generation: str) -> None:
        self.files = files
        self.holder = holder
        self.generation = generation
        self.lost_to: str | None = None  # what took the lease over; once set, never cleared
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, name="dist-resume-writer-lease", daemon=True)
        self._thread.start()

    def _keep_alive(self) -> None:
        while not self._stop.wait(self.holder.refresh_seconds) and self.heartbeat():
            pass

    def heartbeat(self) -> bool:
        """Rewrite this job's record, unless another job took the lease over: then False, for
        good. A write that fails is tried again at the next heartbeat; a lease that stays
        unrefreshed goes stale, and the next heartbeat that gets through finds the job that
        took it over."""
        try:
            if self._taken_over():
                return False
            beat = self.holder.next_beat()
            self.files.overwrite(self.generation, beat.encode())
            self.holder = beat
        except Exception:  # noqa: BLE001 - the heartbeat must outlive any one failed write
            pass
        return True

    def _taken_over(self, own_record: bool = True) -> bool:
        """Whether another job took this lease over (looked up in the store, remembered); with
        ``own_record``, also whether this job's record is still its own."""
        if self.lost_to is None:
            taker = successor(self.generation)
            if self.files.present(taker):
                record = Holder.parse(self.files.read(taker) or b"")
                who = record.describe() if record else "a record that names no job"
                self.lost_to = f"another job took over this run's writer lease ({who}, lease {PREFIX}{taker})"
            elif own_record:
                own = Holder.parse(self.files.read(self.generation) or b"")
                if own is None or own.owner != self.holder.owner:
                    self.lost_to = (f"this job's writer lease {PREFIX}{self.generation} was removed or overwritten by "
                                    "something other than this job (by hand, or by another job on a store whose "
                                    "create-if-absent failed): another job may write there")
        return self.lost_to is not None

    def require_held(self, own_record: bool = True) -> None:
        """Raise if another job took this lease over (with ``own_record``: or if this job's
        record is no longer its own)."""
        if self._taken_over(own_record):
            raise CheckpointError(f"cannot save to {self.files.url}: {self.lost_to}; this job no longer writes there")

    def stop(self) -> None:
        """Stop the heartbeat: the lease goes stale, as a killed job's does."""
        self._stop.set()
        self._thread.join(timeout=self.holder.refresh_seconds)

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released, unless another job took it over."""
        self.stop()
        if not self._taken_over():
            self.files.overwrite(self.generation, self.holder.release().encode())


def _look(files: LeaseFiles) -> Look:
    return Look(files.newest(), time.monotonic(), time.time())


def take(store: CheckpointStore) -> Lease:
    """The writer lease of ``store``'s location for this process; refused with a
    :class:`CheckpointError` naming the holder while another job's lease is alive."""
    store.require_container("save to")
    store.ensure_directory(store.loc.root)  # a run's first file: before DCP makes its directories
    files = LeaseFiles(store)
    forced = os.environ.get(TAKE_OVER_ENV) == "1"
    me = Holder.this_process(_refresh_seconds())
    watch = Watch(_look(files))
    warned = False
    for _ in range(_ATTEMPTS):
        while True:
            sight = watch.latest.sight
            holder = None if sight is None else Holder.parse(sight[1] or b"")
            verdict = watch.verdict(holder, me, forced)
            if verdict in (Verdict.TAKE, Verdict.FORCE):
                break
            if verdict is Verdict.REFUSE:
                raise _refusal(files, watch, holder, sight[0])
            if not warned:
                warnings.warn(f"dist_resume: {files.url} has the writer lease of another job ({holder.describe()}), "
                              f"{holder.whereabouts()}; this job waits, watching it for up to {holder.stale_after:g} s by its own "
                              "clock: if its heartbeat changes, this save is refused, else its lease is stale and "
                              "this job takes it over")
                warned = True
            time.sleep(min(holder.refresh_seconds / _LOOKS_PER_PERIOD, _MAX_LOOK_INTERVAL))
            watch.see(_look(files))
        generation = "0" if sight is None else successor(sight[0])
        took = _took_over(files.url, sight, holder, verdict is Verdict.FORCE, generation)
        if files.create(generation, me.encode()):
            if took:
                warnings.warn(took)
            return Lease(files, me, generation)
        watch.see(_look(files))  # another job created it first: a change this job saw
    raise CheckpointError(f"cannot save to {files.url}: {_ATTEMPTS} times another job created the writer lease "
                          "generation this job was about to create (many jobs starting on the same URL?)")


def _took_over(url: str, sight: tuple[str, bytes | None] | None, holder: Holder | None, forced: bool,
               generation: str) -> str | None:
    """What an operator is told once this job has created lease ``generation`` over ``sight``:
    that it took over a lease it could not show to be free (``forced``: a live-looking one,
    by DIST_RESUME_TAKE_OVER=1). None when there was nothing to tell: no lease, a released
    one, one whose job restarted or is gone, or one watched until stale (said while watched)."""
    if sight is None or (holder is not None and not forced):
        return None
    new = PREFIX + generation
    after = f"(a job still writing there finds {new} at its next heartbeat or save, and writes no more)"
    if holder is None:
        return (f"dist_resume: {url}'s writer lease {PREFIX}{sight[0]} holds no lease record (damaged, emptied, "
                "removed, or written by something other than dist-resume), so it showed no job writing there; this "
                f"job took the lease over as {new} {after}")
    return (f"dist_resume: {url}: {TAKE_OVER_ENV}=1 took over the writer lease of another job ({holder.describe()}, "
            f"lease {PREFIX}{sight[0]}) as {new}, without waiting to see whether that job still runs {after}")


def _refusal(files: LeaseFiles, watch: Watch, holder: Holder, generation: str) -> CheckpointError:
    seen = watch.seen_ago(time.monotonic())
    note = watch.clock_note(holder.heartbeat_at, holder.stale_after)
    return CheckpointError(
        f"cannot save to {files.url}: another job is writing there ({holder.describe()}, lease {PREFIX}{generation}, "
        f"its heartbeat seen by this job {seen:.0f} s ago{note}); one job writes to a run at a time: stop that job, "
        f"or wait until its lease is stale (no heartbeat for {holder.stale_after:g} s), or set {TAKE_OVER_ENV}=1 to "
        "take it over now"
    )


_held: dict[tuple[str, str, str | None], Lease] = {}
_held_lock = threading.Lock()
_release_at_exit = []  # holds True once release_all is registered with atexit


def hold(store: CheckpointStore) -> None:
    """Make sure this process holds the writer lease of ``store``'s location: taken at the
    first save there, checked in the store at every later one, released at a clean exit."""
    key = store.loc.run_key  # one run however its URL is spelled
    with _held_lock:
        lease = _held.get(key)
        if lease is None:
            if not _release_at_exit:
                atexit.register(release_all)
                _release_at_exit.append(True)
            _held[key] = take(store)
            return
    lease.require_held(own_record=False)  # a takeover, before anything is written; the record: before the commit


def confirm(store: CheckpointStore) -> None:
    """Raise if the writer lease this process took for ``store``'s location (at the save's
    start) was taken over since: right before a commit, a job taken over commits nothing."""
    with _held_lock:
        lease = _held.get(store.loc.run_key)
    if lease is not None:
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
