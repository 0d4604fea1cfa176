"""Asynchronous saves: at most one in flight per process, finished (written and committed)
by a background thread; the next save or load waits for it, and reports its failure if
nobody looked at it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from dist_resume.errors import CheckpointError


class SaveHandle:
    """An asynchronous save; its step is committed once ``result()`` returns."""

    def __init__(self, step: int, future: Future) -> None:
        self.step = step
        self._future = future
        self._observed = False

    @property
    def observed(self) -> bool:
        """Whether the caller asked for the outcome (``result`` or ``wait``)."""
        return self._observed

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> int:
        """Wait for the commit; return the step, or raise why it was not committed."""
        self._observed = True
        return self._future.result(timeout)

    def wait(self, timeout: float | None = None) -> None:
        self.result(timeout)


_in_flight: SaveHandle | None = None
_in_flight_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def wait_for_previous_save() -> None:
    """At most one save in flight: wait for it; report its failure if nobody looked at it."""
    global _in_flight
    with _in_flight_lock:
        previous, _in_flight = _in_flight, None
    if previous is None:
        return
    observed = previous.observed
    try:
        previous.result()
    except CheckpointError as exc:
        if not observed:
            raise CheckpointError(f"the asynchronous save of step {previous.step} failed: {exc}") from None


def start(step: int, finish: Callable[..., int], *args: Any) -> SaveHandle:
    """Run ``finish(*args)`` in the background as the save of ``step``, the one now in flight."""
    global _in_flight, _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dist_resume_commit")
    handle = SaveHandle(step, _executor.submit(finish, *args))
    with _in_flight_lock:
        _in_flight = handle
    return handle
