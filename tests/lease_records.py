"""Writer lease records of other jobs, written as those jobs would (a dead one, or a live one
whose heartbeat changes its record), and the messages a save beside them gets
(tests/test_writer_lease.py, test_lease_hostile.py, test_lease_races.py)."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dist_resume.checkpoint.lease_holder import Holder

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def refused(url: str, host: str, pid: int, generation: str, note: str = "", stale_after: str = "0.2") -> str:
    """The refusal of a save beside a live job, as a regex; ``note``: a regex of what it says of clocks."""
    return (re.escape(f"cannot save to {url}: another job is writing there (host {host}, pid {pid}, started ")
            + TIME + re.escape(f", lease .writer_lease_{generation}, its heartbeat seen by this job ")
            + r"\d+ s ago" + note
            + re.escape(f"); one job writes to a run at a time: stop that job, or wait until its lease is stale (no "
                        f"heartbeat for {stale_after} s), or set DIST_RESUME_TAKE_OVER=1 to take it over now"))


def leases(url: str) -> list[str]:
    return sorted(name for name in os.listdir(url) if name.startswith(".writer_lease_"))


def record(heartbeat_at: float, refresh: float = 0.05, beat: int = 0, pid: int = 4242, host: str = "another-host",
           job: str = "", **more: Any) -> bytes:
    """A lease record of another job; ``more``: fields a later version might add."""
    fields = json.loads(Holder("f" * 32, host, pid, "", heartbeat_at - 60, heartbeat_at, refresh, job).encode())
    return json.dumps({**fields, "beat": beat, **more}).encode()


def write_record(path: Path, heartbeat_at: float, **fields: Any) -> None:
    private = path.with_name(path.name + ".writing")
    private.write_bytes(record(heartbeat_at, **fields))
    os.replace(private, path)


@contextmanager
def beating(path: Path, clock_offset: float = 0.0, **fields: Any) -> Iterator[None]:
    """A live job on another machine holding the lease ``path``: its heartbeat rewrites the
    record every 0.05 s, with times read from a clock ``clock_offset`` seconds off this one's."""
    write_record(path, time.time() + clock_offset, **fields)
    stop = threading.Event()

    def beat() -> None:
        beats = 0
        while not stop.wait(0.05):
            beats += 1
            write_record(path, time.time() + clock_offset, beat=beats, **fields)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
