"""Waiting, with a deadline, for what other processes do: the demo jobs' one wait loop."""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(done: Callable[[], bool], timeout: float, timed_out: Callable[[], Exception], seconds: float) -> None:
    """Return once ``done()`` is true, looking every ``seconds``; raise ``timed_out()`` if it
    is still false after ``timeout`` seconds. ``done`` fails the wait at once by raising (a
    process it waits on exited)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise timed_out()
        time.sleep(seconds)
