"""The collectives of a checkpoint save or load: one rank decides, every rank learns the
outcome or the error; background saves get a gloo group of their own; DCP's failures
become one error that says what failed."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from dist_resume.errors import CheckpointError
from dist_resume.process_group import collective_device, group_timeout, peer_failure
from dist_resume.storage import Location

T = TypeVar("T")


def on_every_rank(group: dist.ProcessGroup | None, fn: Callable[[], T], what: str) -> T:
    """Run ``fn`` on every rank of ``group``; if it fails on any, every rank raises: a failed
    rank its own error, the others one :class:`CheckpointError` (``what`` failed, and where)."""
    failure: BaseException | None = None
    try:
        result = fn()
    except BaseException as exc:  # the other ranks must learn of it rather than wait in the next collective
        failure = exc
    if distributed() and dist.get_world_size(group) > 1:
        size = dist.get_world_size(group)
        first = torch.tensor([dist.get_rank(group) if failure is not None else size], dtype=torch.int64,
                             device=collective_device(group))
        dist.all_reduce(first, op=dist.ReduceOp.MIN, group=group)
        if failure is None and int(first) < size:
            raise CheckpointError(f"{what}: it failed on rank {int(first)} (that rank's error says why)")
    if failure is not None:
        raise failure
    return result


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def on_rank0(group: dist.ProcessGroup | None, fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 of ``group`` and hand its result, or its error, to every rank."""
    if not distributed() or dist.get_world_size(group) == 1:
        return fn()
    payload: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank(group) == 0:
        try:
            payload[0] = (True, fn())
        except CheckpointError as exc:
            payload[0] = (False, exc)
        except BaseException as exc:  # other ranks must not wait forever: tell them, raise here
            failure = exc
            payload[0] = (False, CheckpointError(f"rank 0 failed: {type(exc).__name__}: {exc}"))
    dist.broadcast_object_list(payload, group=group, group_src=0)
    if failure is not None:
        raise failure
    ok, value = payload[0]
    if not ok:
        raise value
    return value


_GLOO_GROUPS: dict[tuple[int, ...], dist.ProcessGroup] = {}


@contextmanager
def peers_answer(what: str | Callable[[], str], group: dist.ProcessGroup | None) -> Iterator[None]:
    """Collectives of ``what`` ("cannot save step 5 at URL", or a function that says it once a
    peer is lost): a peer rank that is gone or late beyond ``group``'s timeout is one
    :class:`CheckpointError` that says so, on every rank that waited for it, instead of the
    transport's raw error."""
    try:
        yield
    except CheckpointError:
        raise  # the library's own error already says what happened (a CheckpointError is a RuntimeError)
    except RuntimeError as exc:
        message = peer_failure(exc, what, group)
        if message is None:
            raise
        raise CheckpointError(message) from None


def checkpoint_group(group: dist.ProcessGroup | None) -> dist.ProcessGroup | None:
    """A gloo group of ``group``'s ranks used only by background saves, created once, so that
    their collectives never interleave with the training's on the same group."""
    if not distributed():
        return None
    ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
    if ranks not in _GLOO_GROUPS:
        # the job's timeout, not torch's 30-minute default: a peer gone mid-save ends the wait as
        # the job's own collectives would
        _GLOO_GROUPS[ranks] = dist.new_group(ranks=list(ranks), backend="gloo", timeout=group_timeout(group))
    return _GLOO_GROUPS[ranks]


# What DCP warns at every save or load without a process group; the library means it so.
_SINGLE_PROCESS = (r"torch\.distributed is (disabled, )?unavailable or uninitialized, assuming the intent is to "
                   r"(save|load) in a single process\.$")


@contextmanager
def single_process_intended() -> Iterator[None]:
    """Within: DCP's warning that it saves or loads in a single process is not shown; every
    other warning is, as the caller's filters say."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS, category=UserWarning)
        yield


def dcp_call(loc: Location, action: str, where: str, fn: Callable[..., T], *args: Any,
              **kwargs: Any) -> T:
    """Call a DCP function (without a process group: saying nothing of it); turn its
    CheckpointException (a BaseException) into an error that says what failed, preferring
    a dist_resume error raised on some rank."""
    try:
        with single_process_intended() if kwargs.get("no_dist") or not distributed() else nullcontext():
            return fn(*args, **kwargs)
    except CheckpointException as exc:
        failures = sorted(exc.failures.items())
        for _, (error, _trace) in failures:
            if isinstance(error, CheckpointError):
                raise error from None
        _, (first, _trace) = failures[0]
        raise CheckpointError(
            f"{action} {where} failed on rank(s) {[rank for rank, _ in failures]}: "
            f"{type(first).__name__}: {loc.redact(str(first))}"
        ) from None
