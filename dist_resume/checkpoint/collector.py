"""Python's cyclic garbage collector paused while a load builds its many small objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off meanwhile (as it was before, after). Building a tree of many
    small objects (a save's metadata holds ~25 per saved rank, a decoded loader state a few
    more) sets off collections that each scan every object the process holds (torch's
    import alone makes ~250,000): at 4,096 saved ranks they took most of an elastic load.
    What a load builds is freed by reference counting; nothing is lost by waiting."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
