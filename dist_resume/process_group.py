"""A worker process's life in a job: it ends with its launcher (by default when torchrun
started it), and leaves the process group at the job's end so that it exits; what the
library's collectives need of the job's group (its timeout, the device its tensors live on,
the transport's errors)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

_PR_SET_PDEATHSIG = 1  # prctl(2)
END_WITH_LAUNCHER_ENV = "DIST_RESUME_END_WITH_LAUNCHER"  # "0": torchrun's workers outlive a killed launcher


def end_with_launcher() -> None:
    """End this process (SIGKILL) when the process that started it dies, even by SIGKILL
    (Linux; elsewhere it does nothing).

    torchrun starts each worker in a session of its own, so a launcher killed with SIGKILL,
    which runs no handler, would leave its workers training and committing checkpoints beside
    the job a restart starts on the same URL. Importing dist_resume in a worker that torchrun
    started does this already (see ``end_with_torchrun``); call it yourself under another
    launcher that starts workers as its children.
    """
    if not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def launcher_ending_wanted() -> bool:
    """Whether workers end with their launcher: yes unless ``DIST_RESUME_END_WITH_LAUNCHER=0``;
    any value but 0 or 1 is refused with a ValueError."""
    value = os.environ.get(END_WITH_LAUNCHER_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{END_WITH_LAUNCHER_ENV}={value!r} is neither 1 (the default: the workers that "
                         "torchrun starts end with it) nor 0 (they outlive a launcher killed with kill -9)")
    return value == "1"


def started_by_torchrun() -> bool:
    """Whether torchrun started this process as one of its workers: torchrun names its run in
    a worker's environment and starts the worker in a session of its own, which the worker
    leads. The worker's own children (DataLoader workers, subprocesses) inherit the
    environment, not the lead of a session."""
    return "TORCHELASTIC_RUN_ID" in os.environ and hasattr(os, "getsid") and os.getsid(0) == os.getpid()


def end_with_torchrun() -> None:
    """If torchrun started this process, make it end with torchrun (``end_with_launcher``),
    unless ``DIST_RESUME_END_WITH_LAUNCHER=0``. Importing dist_resume calls this: a torchrun
    worker killed with its launcher neither trains nor commits beside the restarted job.
    torchrun's own restarts of its workers are unaffected (torchrun, their parent, lives on)."""
    if launcher_ending_wanted() and started_by_torchrun():
        end_with_launcher()


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


def group_timeout(group: dist.ProcessGroup | None = None) -> timedelta:
    """How long ``group``'s collectives wait for a peer (set by ``init_process_group`` or
    ``new_group``); torch's default where the backend does not say."""
    pg = group or dist.group.WORLD
    for device in ("cpu", "cuda"):
        try:
            return pg._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError):
            continue
    return default_pg_timeout


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where the tensors of a collective on ``group`` live: the CPU for gloo (alone or beside
    another backend), else the current accelerator (NCCL takes no CPU tensors)."""
    if "gloo" in str(dist.get_backend(group)):
        return torch.device("cpu")
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None:
        return torch.device("cpu")
    return torch.device(accelerator.type, torch.accelerator.current_device_index())


# Errors of the transport under a collective (a peer that exited, or did not come in time);
# torch raises them as plain RuntimeErrors from gloo or NCCL.
_TRANSPORT_WORDS = ("gloo", "NCCL", "Connection reset", "Connection closed", "Timed out", "timed out")


def peer_failure(exc: BaseException, what: str | Callable[[], str],
                 group: dist.ProcessGroup | None = None) -> str | None:
    """What to say when ``exc``, raised by a collective of ``what`` (or of what ``what()``
    says, asked only then), means that a peer rank is gone or did not take part within
    ``group``'s timeout; None if it means something else."""
    if not isinstance(exc, RuntimeError) or not (isinstance(exc, dist.DistError)
                                                 or any(word in str(exc) for word in _TRANSPORT_WORDS)):
        return None
    seconds = group_timeout(group).total_seconds()
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    what = what() if callable(what) else what
    return (f"{what}: a peer rank is gone or did not take part within the process group's timeout "
            f"({seconds:g} s) ({type(exc).__name__}: {detail})")
