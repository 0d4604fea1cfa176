"""One rank of a job whose ranks name different checkpoint locations (issue 11 point 3),
pass different arguments to one save or load (issue 24 point 1), save where another job
holds the writer lease (issue 23 point 3), hold a loader field that one rank refuses, or
load a step whose metadata is damaged for one rank only.

Run by ``tests.checkpoint_worker.run(..., script=__file__)``; each rank writes the error it
got (or "none") to ``out/<scenario>-error-<rank>.txt``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _record(args: dict[str, Any], scenario: str, call: Any) -> None:
    import torch.distributed as dist

    from dist_resume.errors import CheckpointError

    try:
        call()
        outcome = "none"
    except CheckpointError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    Path(args["out"], f"{scenario}-error-{dist.get_rank()}.txt").write_text(outcome)


def per_rank_urls(args: dict[str, Any]) -> None:
    """Each rank saves to, then loads from, its own directory (node-local disks)."""
    import torch
    import torch.distributed as dist

    from dist_resume import load_checkpoint, save_checkpoint, shut_down_distributed

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    url = os.path.join(args["root"], f"rank{rank}")
    state = {"w": torch.full((2,), float(rank))}
    _record(args, "save", lambda: save_checkpoint(state, url, 5, async_save=args["async_save"]))
    _record(args, "load", lambda: load_checkpoint(state, url))
    os.chdir(os.path.join(args["root"], f"cwd{rank}"))  # one relative URL, two places
    _record(args, "relative", lambda: save_checkpoint(state, "run", 5))
    shut_down_distributed()


def node_local_storage(args: dict[str, Any]) -> None:
    """Every rank passes the same URL, but each process has storage of its own (memory://
    is per process, as /tmp/ckpt is per node)."""
    import torch
    import torch.distributed as dist

    from dist_resume import list_checkpoints, save_checkpoint, shut_down_distributed

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    state = {"w": torch.full((2,), float(dist.get_rank())), f"rank{dist.get_rank()}": torch.ones(3)}
    _record(args, "node_local", lambda: save_checkpoint(state, "memory://run", 5))
    Path(args["out"], f"node_local-committed-{dist.get_rank()}.txt").write_text(
        json.dumps([info.step for info in list_checkpoints("memory://run")]))
    shut_down_distributed()


def disagreeing_arguments(args: dict[str, Any]) -> None:
    """One URL, but each rank passes its own step, keep or async_save; then its own step to
    a load. Every call must fail on every rank, before anything is written or read."""
    import torch
    import torch.distributed as dist

    from dist_resume import load_checkpoint, save_checkpoint, shut_down_distributed

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    url = args["url"]
    state = {"w": torch.full((2,), float(rank))}
    _record(args, "step", lambda: save_checkpoint(state, url, 5 + rank))
    _record(args, "keep", lambda: save_checkpoint(state, url, 5, keep=1 + rank))
    # a rank that would create the background saves' gloo group alone waited for its peer forever
    _record(args, "async", lambda: save_checkpoint(state, url, 5, async_save=rank == 0))
    _record(args, "several", lambda: save_checkpoint(state, url, 5 + rank, keep=None if rank else 2))
    _record(args, "load_step", lambda: load_checkpoint(state, url, 1 + rank))
    Path(args["out"], f"loaded-{rank}.txt").write_text(json.dumps(state["w"].tolist()))
    shut_down_distributed()


class _RaisesOnSave:
    """A Stateful whose state_dict raises: a rank that fails in the middle of a save."""

    def state_dict(self) -> dict[str, Any]:
        raise RuntimeError("this rank's state could not be taken")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _StallsOnSave:
    """A Stateful whose state_dict never returns while rank 0 is in the save: a rank that
    stops answering mid-save, alive (its connections open) until rank 0 has written its
    outcome to `done`; if rank 0 hangs, the launcher's timeout ends both."""

    def __init__(self, done: Path) -> None:
        self._done = done

    def state_dict(self) -> dict[str, Any]:
        import time

        while not self._done.exists():
            time.sleep(0.1)
        os._exit(0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def peer_gone(args: dict[str, Any]) -> None:
    """Rank 1 leaves (a crash, seen from rank 0: it exits without a word) before a save
    that rank 0 starts; or raises inside the save and exits; or stops answering inside it. The job's group timeout is
    10 s: rank 0's call must end within it with a CheckpointError, not hang for torch's
    30-minute default nor surface gloo's raw error."""
    import torch
    import torch.distributed as dist

    from dist_resume import save_checkpoint

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    rank = dist.get_rank()
    state: dict[str, Any] = {"w": torch.full((2,), float(rank))}
    if args["how"] == "raises" and rank == 1:
        state["bad"] = _RaisesOnSave()
    if args["how"] == "stalls" and rank == 1:
        state["bad"] = _StallsOnSave(Path(args["out"], "peer_gone-error-0.txt"))
    if rank == 1 and args["how"] == "exits":
        os._exit(0)
    try:
        handle = save_checkpoint(state, args["url"], 5, async_save=args["async_save"])
        if handle is not None:
            handle.result()
        outcome = "none"
    except Exception as exc:  # what rank 0 gets: one CheckpointError, whatever gloo raised
        outcome = f"{type(exc).__name__}: {exc}"
    Path(args["out"], f"peer_gone-error-{rank}.txt").write_text(outcome)
    os._exit(0)  # the group cannot be left in order: a peer is gone


def leased_elsewhere(args: dict[str, Any]) -> None:
    """Both ranks save into a URL whose writer lease another job holds: alive, rank 0 is
    refused and rank 1 gets the same error, in the save's own collective; dead, rank 1 waits
    in that collective while rank 0 watches the lease go stale, and both save."""
    import torch
    import torch.distributed as dist

    from dist_resume import save_checkpoint, shut_down_distributed

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    _record(args, "leased", lambda: save_checkpoint({"w": torch.zeros(2)}, args["url"], 5))
    shut_down_distributed()


class _UndeclaredOnRank1:
    """A data loader whose state, on rank 1 only, holds a field no declaration names (what a
    dist_resume bug would save): refused on that rank before anything is written."""

    def __init__(self, loader: Any, rank: int) -> None:
        self._loader = loader
        self._rank = rank

    def state_dict(self) -> dict[str, Any]:
        import torch

        state = self._loader.state_dict()
        if self._rank == 1:
            state["rank_1"]["undeclared"] = torch.zeros(1, dtype=torch.int64)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._loader.load_state_dict(state)


def undeclared_field(args: dict[str, Any]) -> None:
    """Rank 1's loader state holds an undeclared field. Rank 0 used to go on into the save's
    next collective and wait for the group timeout (60 s here, beyond the launcher's 40 s);
    now both ranks get rank 1's refusal from the agreement, and nothing is written."""
    import torch.distributed as dist

    from dist_resume import ResumableDataLoader, save_checkpoint, shut_down_distributed

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    loader = ResumableDataLoader(range(8), batch_size=2, seed=0, rank=rank, world_size=2)
    state = {"loader": _UndeclaredOnRank1(loader, rank)}
    _record(args, "undeclared", lambda: save_checkpoint(state, args["url"], 5))
    shut_down_distributed()


def damaged_own_record(args: dict[str, Any]) -> None:
    """Both ranks load a step whose split metadata holds a damaged record for rank 1 only.
    Each rank reads its own record: rank 1 fails, and rank 0 must not wait for it in DCP's
    collectives until the group timeout (60 s, beyond the launcher's 40 s)."""
    import torch
    import torch.distributed as dist
    from torch.utils.data import RandomSampler

    from dist_resume import ResumableDataLoader, load_checkpoint, shut_down_distributed

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    loader = ResumableDataLoader(list(range(30)), sampler=RandomSampler(range(30), generator=torch.Generator()),
                                 batch_size=2, rank=rank, world_size=2)
    _record(args, "own_record", lambda: load_checkpoint({"loader": loader}, args["url"]))
    shut_down_distributed()


if __name__ == "__main__":
    {"per_rank_urls": per_rank_urls, "node_local_storage": node_local_storage,
     "disagreeing_arguments": disagreeing_arguments, "peer_gone": peer_gone,
     "leased_elsewhere": leased_elsewhere, "undeclared_field": undeclared_field,
     "damaged_own_record": damaged_own_record}[sys.argv[1]](json.loads(sys.argv[2]))
