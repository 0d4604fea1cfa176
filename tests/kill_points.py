"""Where a rank of a multi-process test stops to be killed: it writes a ``ready`` file and
blocks until SIGKILL, or until the test releases it (imported by tests/checkpoint_worker.py,
tests/save_outcome_worker.py and tests/faults/kill_worker.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from fsspec.implementations.local import LocalFileSystem


def wait_for_kill(ready: str, step: int, release: str | None = None) -> None:
    """Writes `step` to the file `ready`, whole or not at all (a test waits for it to exist,
    then kills this process), and blocks until the process is killed, or until the file
    `release` exists."""
    Path(f"{ready}.partial").write_text(str(step))
    os.replace(f"{ready}.partial", ready)
    if release is None:
        threading.Event().wait()  # until SIGKILL
    while not os.path.exists(release):
        time.sleep(0.05)


def block_before(module: ModuleType, name: str, ready: str, release: str | None = None) -> None:
    """The next call of ``module.name`` first waits at a kill point (``wait_for_kill``)."""
    original: Callable[..., Any] = getattr(module, name)

    def blocked(*args: Any, **kwargs: Any) -> Any:
        setattr(module, name, original)
        wait_for_kill(ready, -1, release)
        return original(*args, **kwargs)

    setattr(module, name, blocked)


class BlockingFileSystem(LocalFileSystem):
    """Local files under ``killblock://`` URLs; once ``ready`` is set, the next shard write
    stores 100 bytes, writes ``ready`` and blocks until the process is killed."""

    protocol = "killblock"
    ready: str | None = None

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("killblock://"))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        file = super()._open(path, mode, **kwargs)
        if self.ready and "w" in mode and path.endswith(".distcp"):
            file.write(b"\0" * 100)
            file.flush()
            wait_for_kill(self.ready, -1)
        return file
