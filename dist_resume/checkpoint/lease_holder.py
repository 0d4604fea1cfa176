"""Who holds a run's writer lease: the record stored in the lease object, and whether the
process it names is alive. A record that cannot be read names no one. The record's times
are its writer's clock: they describe the job, never decide whether its lease is stale."""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
import uuid
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone

# A lease seen without a heartbeat for this many of its holder's refresh periods is stale.
STALE_PERIODS = 4
MAX_REFRESH = 86400.0  # seconds: a record promising a slower heartbeat is not one of ours
LEASE_LIMIT = 4096  # bytes: a lease record is a few hundred


def _machine() -> str:
    """This kernel's boot and this process's pid namespace (Linux), else "": two processes
    with the same value see the same pids."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, Linux), None if it is gone or a
    zombie (killed, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


@dataclass(frozen=True)
class Holder:
    """The job holding a lease: its identity, and its heartbeat."""

    owner: str  # unique per lease taken
    host: str
    pid: int
    process: str  # machine and start time: tells pid reuse apart ("" where unknown)
    started_at: float
    heartbeat_at: float
    refresh_seconds: float
    job: str = ""  # torchrun's run id (TORCHELASTIC_RUN_ID): the same job after a restart of its workers
    beat: int = 0  # heartbeats written: every heartbeat changes the record, whatever the clocks say
    released: bool = False  # the job ended cleanly: its lease is free

    @classmethod
    def this_process(cls, refresh_seconds: float) -> Holder:
        now = time.time()
        started = _start_time(os.getpid()) if sys.platform.startswith("linux") else None
        machine = _machine()
        process = f"{machine}@{started}" if machine and started else ""
        return cls(uuid.uuid4().hex, socket.gethostname(), os.getpid(), process, now, now, refresh_seconds,
                   os.environ.get("TORCHELASTIC_RUN_ID", ""))

    def next_beat(self) -> Holder:
        return replace(self, heartbeat_at=time.time(), beat=self.beat + 1)

    def release(self) -> Holder:
        return replace(self.next_beat(), released=True)

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The record in ``data``; None if it is not one (damaged, or written by something else)."""
        try:
            record = json.loads(data)
            # fields a later version added are not ours to judge; missing ones are damage
            holder = cls(**{name: value for name, value in record.items() if name in _FIELDS})
        except (ValueError, TypeError, AttributeError):
            return None
        numbers = (holder.started_at, holder.heartbeat_at, holder.refresh_seconds)
        if not (all(isinstance(v, str) for v in (holder.owner, holder.host, holder.process, holder.job))
                and type(holder.pid) is int and type(holder.beat) is int and type(holder.released) is bool
                and all(type(v) in (int, float) and math.isfinite(v) for v in numbers)
                and 0 < holder.refresh_seconds <= MAX_REFRESH):
            return None
        return holder

    @property
    def stale_after(self) -> float:
        return STALE_PERIODS * self.refresh_seconds

    def replaceable_by(self, other: Holder) -> bool:
        """Whether ``other`` may take this lease over without watching it: its process is gone
        from this machine, or ``other`` is the same torchrun job, whose workers torchrun
        restarted (maybe on another node)."""
        same_job = self.job not in ("", "none") and self.job == other.job  # "none": torchrun's default id
        return same_job or self._gone()

    def on_this_machine(self) -> bool:
        """Whether its process ran on this machine, in this pid namespace: the only place
        where this job can tell whether it is gone."""
        machine = self.process.rpartition("@")[0]
        return bool(machine) and self.host == socket.gethostname() and machine == _machine()

    def whereabouts(self) -> str:
        """Whether this job can check the holder's process, said for a message."""
        if self.on_this_machine():
            return "its process runs on this machine"
        if self.host != socket.gethostname():
            return "on another machine, so this job cannot check its process"
        return "its process cannot be checked from this job (another container, boot or pid namespace)"

    def _gone(self) -> bool:
        if not self.on_this_machine():
            return False  # another machine (or unknown): only the heartbeat tells
        return _start_time(self.pid) != self.process.rpartition("@")[2]

    def describe(self) -> str:
        return f"host {self.host}, pid {self.pid}, started {_utc(self.started_at)}"


_FIELDS = frozenset(field.name for field in fields(Holder))


def _utc(seconds: float) -> str:
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return f"{seconds!r} (not a time)"
