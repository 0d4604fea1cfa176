"""Leaving the process group at the end of a job, so that the process exits."""

from __future__ import annotations

import torch.distributed as dist


def shut_down_distributed() -> None:
    """Leave the default process group once every rank is done; call it last, on every rank.

    gloo's worker thread drops its reference to a collective after the caller's wait has
    returned. When that is the last reference, the thread frees the collective's tensors,
    which needs the GIL; freeing the process group joins that thread while holding the GIL,
    and the job hangs at exit. Holding the final barrier's work here until the group is gone
    means the thread never holds the last reference to anything. Nothing else (a DDP model)
    may keep the group alive past ``destroy_process_group``.
    """
    barrier = dist.barrier(async_op=True)
    barrier.wait()
    dist.destroy_process_group()
    del barrier  # freed on this thread, after the gloo threads have stopped
