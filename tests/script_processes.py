"""Scripts the tests run as processes of their own (the ranks of multi-process jobs, the
documentation's snippets), started from a fork server that has already imported torch and
dist_resume.

Each is still its own process with its own gloo connections, environment, working
directory, argv, ``sys.path[0]`` and ``__main__``: the script runs as ``python script args``
would run it, atexit handlers included. Only the interpreter start and the imports are shared.
Those were most of a small job's time on 2 cores: every rank imported torch and
torch.distributed.checkpoint (about 5 s of CPU) before doing half a second of work.
Jobs started by torchrun, and processes whose imports are what a test measures, are not
started this way.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# What every rank script imports first; the fork server imports it once, before any test
# runs a process group or starts a thread in it.
PRELOADED = ["torch", "torch.distributed.checkpoint", "dist_resume", "tests.script_processes"]

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOADED)


def _run_script(script: str, argv: Sequence[str], env: dict[str, str], log: str, cwd: str | None) -> None:
    """In the forked process: ``python script *argv`` with ``env`` in ``cwd``, output to ``log``."""
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(descriptor, 1)
    os.dup2(descriptor, 2)
    os.close(descriptor)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    multiprocessing.set_start_method(None, force=True)  # this platform's default, not the server's
    sys.argv = [script, *argv]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is not None:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # as the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # what the interpreter runs at its exit; os._exit skips it
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ScriptProcess:
    """``python script *argv`` started, with the part of ``subprocess.Popen``'s interface the
    tests use; its output (stdout and stderr) goes to the file ``log``."""

    def __init__(self, script: str, argv: Sequence[str], env: dict[str, str], log: Path,
                 cwd: Path | None = None) -> None:
        self.args = [script, *argv]
        self._process = _CONTEXT.Process(target=_run_script,
                                         args=(script, list(argv), env, str(log), None if cwd is None else str(cwd)))
        self._process.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self._process.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn_ranks(function: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """``torch.multiprocessing.spawn(function, args, nprocs)``, the ranks forked from the
    fork server instead of started as fresh interpreters."""
    import torch.multiprocessing

    torch.multiprocessing.start_processes(function, args=args, nprocs=nprocs, start_method="forkserver")
