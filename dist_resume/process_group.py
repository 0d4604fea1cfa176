"""A worker process's life in a job: it ends with its launcher, and leaves the process group
at the job's end so that it exits."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import torch.distributed as dist

_PR_SET_PDEATHSIG = 1  # prctl(2)


def end_with_launcher() -> None:
    """End this process (SIGKILL) when the process that started it dies, even by SIGKILL;
    call it first thing in a script that torchrun runs (Linux; elsewhere it does nothing).

    torchrun starts each worker in a session of its own, so a launcher killed with SIGKILL,
    which runs no handler, leaves its workers training and committing checkpoints beside the
    job a restart starts on the same URL. The launch scripts run every script through
    ``python -m dist_resume.launched``, which calls this first.
    """
    if not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def shut_down_distributed() -> None:
    """Leave the default process group once every rank is done; call it last, on every rank
    (without a process group it does nothing).

    gloo's worker thread drops its reference to a collective after the caller's wait has
    returned. When that is the last reference, the thread frees the collective's tensors,
    which needs the GIL; freeing the process group joins that thread while holding the GIL,
    and the job hangs at exit. Holding the final barrier's work here until the group is gone
    means the thread never holds the last reference to anything. Nothing else (a DDP model)
    may keep the group alive past ``destroy_process_group``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return  # a single-process run: no group to leave
    barrier = dist.barrier(async_op=True)
    barrier.wait()
    dist.destroy_process_group()
    del barrier  # freed on this thread, after the gloo threads have stopped
