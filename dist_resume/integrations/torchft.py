"""torchft (per-step fault tolerance: replica groups that leave and join without a restart)
with `ResumableDataLoader`: every sample of an epoch in exactly one committed step (G2).

`ManagedLoader(loader, manager)` starts each step's quorum and hands this replica group its
part of the step: with `n` participating groups, the group of participating rank `r` takes
the `r`-th part of the next `n x W x batch_size` positions of the epoch's order (`W` ranks per
group, each its own part of that). The position moves only when the step commits
(`manager.should_commit()`); an uncommitted step's positions are served again at the next
step, over whoever takes part then. The position travels with the Manager's state to a group
that heals (`register_state_dict_fn`), and is the loader's ordinary state in a checkpoint.

torchft is imported only when a `ManagedLoader` is made; dist_resume never needs it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import torch

from dist_resume.loader.replica_steps import ReplicaSteps
from dist_resume.loader.resumable import ResumableDataLoader

STATE_KEY = "dist_resume_loader"  # the Manager's state dict entry that holds the loader's position


class ManagedLoader:
    """A `ResumableDataLoader` under torchft's `Manager`: iterate it for one epoch's steps.

    Each `next()` settles the previous step (committed if the Manager's step moved on), starts
    the Manager's quorum, and returns this rank's batch of the step: `manager.start_quorum()`
    called during the step (`torchft.optim.OptimizerWrapper.zero_grad` calls it) raises. The
    loop averages the gradients over the groups (`allreduce_gradients`), then steps the optimizer
    only if `manager.should_commit()`. The epoch ends after the step that commits its last
    positions; `epoch` then names the next one, so `while managed.epoch < epochs: for batch in
    managed: ...` runs the same steps in every group, also in one that healed mid-epoch.

    A group that does not take part in a step (it heals with `use_async_quorum=True`, or is a
    spare) is handed a copy of the first group's part, which torchft zeroes; it counts nothing.
    With `use_async_quorum=True` the Manager needs `init_sync=False`: at step 0 torchft would heal
    every group but one while counting it as a participant, and its part would be lost. The
    loader needs a `seed`, `drop_last=False` and `even_batches=True` (the final step is padded,
    G2), a map-style dataset or `Mixture` in its own order; `ShardedStream`s and other
    IterableDatasets, custom samplers and `in_order=False` are refused (`regroup`).

    Its `state_dict` / `load_state_dict` are the loader's at its own shard, at the committed
    position: put the `ManagedLoader` (not the loader) in `save_checkpoint`'s state, and a job
    restarted from it at any number of groups resumes exactly there (G1-G3)."""

    def __init__(self, loader: ResumableDataLoader, manager: Any, *, key: str = STATE_KEY) -> None:
        from torchft import Manager

        if not isinstance(loader, ResumableDataLoader):
            raise TypeError(f"ManagedLoader expects a ResumableDataLoader, got {type(loader).__name__}")
        if not isinstance(manager, Manager):
            raise TypeError(f"ManagedLoader expects a torchft.Manager, got {type(manager).__name__}")
        if manager._use_async_quorum and manager._init_sync:
            raise ValueError(
                "a torchft Manager with use_async_quorum=True and init_sync=True counts the groups it heals at step "
                "0 as participants while zeroing their gradients: their part of that step would be lost. Pass "
                "use_async_quorum=False (recommended: a group heals before its step and trains its part), or "
                "init_sync=False with identically initialized models")
        self._steps = ReplicaSteps(loader)
        self._manager = manager
        self._lock = threading.Lock()  # the Manager reads the state from its quorum thread
        self._served: int | None = None  # the Manager's step when the served step's batch was handed out
        manager.register_state_dict_fn(key, self.load_state_dict, self.state_dict)
        # The loader starts each step's quorum: another one during a step would run the step
        # under other groups than its batch was cut for. Refused when it is called, before it trains.
        self._start_quorum = manager.start_quorum
        manager.start_quorum = self._refuse_quorum_in_step

    @property
    def loader(self) -> ResumableDataLoader:
        return self._steps.loader

    @property
    def epoch(self) -> int:
        """The epoch of the step being served, or of the next step once it settled."""
        return self._steps.epoch

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            self._settle(final=True)
            self._steps.begin_epoch()
        manager = self._manager
        while not self._steps.epoch_ended:
            self._start_quorum()
            replicas, replica_rank = manager.num_participants(), manager.participating_rank()
            with self._lock:
                batch = self._steps.serve(replicas, replica_rank if manager.is_participating() else None)
                self._served = manager.current_step()
            yield batch
            with self._lock:
                self._settle(final=True)

    def _settle(self, final: bool) -> None:
        """Count the served step if the Manager committed it; `final`: its outcome is known."""
        step = self._served
        if step is None:
            return
        now = self._manager.current_step()
        if now == step and not final:
            self._steps.committed_position()
            return
        if now not in (step, step + 1):
            raise RuntimeError(f"torchft's Manager went from step {step} to step {now} within one step of the "
                               "loader: the loader's position cannot follow it")
        self._served = None
        self._steps.settle(now == step + 1)

    def _refuse_quorum_in_step(self, *args: Any, **kwargs: Any) -> None:
        """The Manager's `start_quorum` while the ManagedLoader serves its steps."""
        if self._served is not None:
            raise RuntimeError(
                "manager.start_quorum() was called during a step that ManagedLoader started: the step would run "
                "with other groups than its batch was cut for. ManagedLoader starts each step's quorum itself; "
                "torchft.optim.OptimizerWrapper.zero_grad starts one too: zero the wrapped optimizer's gradients "
                "(wrapper.optim.zero_grad()) instead")
        self._start_quorum(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state at its own shard and the committed position (a step served and
        not committed yet is not in it)."""
        with self._lock:
            self._settle(final=False)
            return self._steps.loader.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a state of the loader's own shard: a peer's, handed over by the
        Manager when this group heals, or a checkpoint's."""
        with self._lock:
            self._steps.loader.load_state_dict(state_dict)
            self._steps.loaded()


def allreduce_gradients(manager: Any, module: torch.nn.Module) -> None:
    """Average `module`'s gradients over the step's participating groups: one
    `manager.allreduce(grad).wait()` per parameter (a missing gradient is allreduced as zeros,
    so that every group runs the same collectives). With torchft 0.2.0 this survives a peer
    that dies mid-step (the step does not commit), where `torchft.ddp.DistributedDataParallel`
    fails in the healthy group with `AssertionError` in its communication hook."""
    for parameter in module.parameters():
        if not parameter.requires_grad:
            continue
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        manager.allreduce(parameter.grad).wait()
