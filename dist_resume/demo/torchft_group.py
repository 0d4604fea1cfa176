"""One replica group of the torchft demo (``dist-resume demo --torchft``): a process that
trains the demo's classifier under torchft's ``Manager``, its data from a
``ManagedLoader`` (or, to compare, from torchft's own ``DistributedSampler``).

Run by ``dist_resume.demo.torchft_job``, one process per rank of each group and life::

    python -m dist_resume.demo.torchft_group --lighthouse http://127.0.0.1:PORT --replica-id g0 --records DIR

A group of several ranks is one process per rank (``--group-rank R --group-size W``; rank 0
hosts the group's store and writes its port to ``--group-store``): each rank's loader serves
its own shard of the group's part, and the ranks average their gradients inside the group
(gloo) before the Manager averages them over the groups.

Each process writes ``DIR/<replica id>-<pid>.jsonl``: an ``up`` line once its Manager runs,
then one line per step it ran, after ``should_commit`` (a step cut by a kill has no line).
Hooks for the scenarios (each a file or a step): ``--ready-file`` is written once the Manager
runs and ``--start-file`` awaited before the first step; ``--kill-at-step S`` SIGKILLs the
group (its process group: every rank) in the middle of Manager step S (after the forward pass);
``--hold-at-step S`` (repeatable) writes ``<--hold-prefix>-S.held`` when the Manager reaches
step S and waits for ``...-S.release``; ``--kill-on-hand-off S`` SIGKILLs the group when the
Manager, at step S or later, reads its state for a healing peer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dist_resume import ResumableDataLoader, TrainState, load_checkpoint, save_checkpoint
from dist_resume.demo.data import SyntheticDataset, make_model
from dist_resume.demo.records import EpochPositions, fingerprint
from dist_resume.integrations.torchft import ManagedLoader, allreduce_gradients

_POLL_SECONDS = 0.005  # a held group's release is within B11-first-data's timed restart


def parser() -> argparse.ArgumentParser:
    """The options of a group (the benchmark's groups add their own)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lighthouse", required=True, help="the lighthouse's URL")
    parser.add_argument("--replica-id", required=True, help="this group's id: g<index>")
    parser.add_argument("--records", required=True, type=Path, help="directory of the records")
    parser.add_argument("--dataset-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--data", choices=("dist-resume", "torchft-sampler"), default="dist-resume")
    parser.add_argument("--replica-groups", type=int, default=2, help="torchft-sampler: num_replica_groups")
    parser.add_argument("--gradients", choices=("allreduce", "ddp"), default="allreduce",
                        help="manager.allreduce per gradient, or torchft's DistributedDataParallel")
    parser.add_argument("--async-quorum", action="store_true", help="use_async_quorum=True (init_sync=False)")
    parser.add_argument("--timeout", type=float, default=60.0, help="the Manager's timeouts, seconds")
    parser.add_argument("--group-rank", type=int, default=0, help="this process's rank in its replica group")
    parser.add_argument("--group-size", type=int, default=1, help="ranks (processes) in the replica group")
    parser.add_argument("--group-store", type=Path,
                        help="with --group-size > 1: the file in which rank 0 writes its store's port")
    parser.add_argument("--ready-file", type=Path)
    parser.add_argument("--start-file", type=Path)
    parser.add_argument("--kill-at-step", type=int)
    parser.add_argument("--hold-at-step", type=int, action="append", default=[])
    parser.add_argument("--hold-prefix", type=Path)
    parser.add_argument("--kill-on-hand-off", type=int, metavar="STEP")
    parser.add_argument("--checkpoint", help="save the group's state here every --save-every committed steps")
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--resume", help="load the latest committed checkpoint of this URL at the start")
    return parser


def kill_group() -> None:
    """SIGKILL every rank of this replica group at once: the process group that TorchftJob
    gives the group's ranks (this process alone where it runs in its launcher's)."""
    group = os.getpgid(0)
    if group == os.getpgid(os.getppid()):
        os.kill(os.getpid(), signal.SIGKILL)
    os.killpg(group, signal.SIGKILL)


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(_POLL_SECONDS)


def _write_file(path: Path, text: str = "") -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


class _Records:
    """This life's lines: its Manager coming up, then each step."""

    def __init__(self, directory: Path, replica_id: str, positions: EpochPositions) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._file = open(directory / f"{replica_id}-{os.getpid()}.jsonl", "a", encoding="utf-8")
        self._replica_id = replica_id
        self._positions = positions

    def write(self, **line: Any) -> None:
        self._file.write(json.dumps({"replica": self._replica_id, "pid": os.getpid(), "time": time.time(), **line})
                         + "\n")
        self._file.flush()

    def step(self, epoch: int, batch: tuple, served: float, committed: bool, taking_part: bool,
             participants: int, rank: int | None, step: int, group: tuple[int, int] = (0, 1)) -> None:
        """One step: its batch, and when it was served; `group`: (rank in the group, group size)."""
        features, _, indices = batch
        indices = indices.tolist()
        self.write(event="step", step=step, epoch=epoch, participants=participants, rank=rank,
                   group_rank=group[0], group_size=group[1],
                   taking_part=taking_part, committed=committed, served=served, indices=indices,
                   positions=self._positions(epoch, indices),
                   fingerprints=[fingerprint(sample) for sample in features])


class GroupState:
    """The model and optimizer as the Manager hands them to a healing peer (a torch state)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, kill_on_hand_off: int | None) -> None:
        self.model, self.optimizer, self.kill_on_hand_off = model, optimizer, kill_on_hand_off
        self.manager: Any = None

    def state_dict(self) -> dict[str, Any]:
        # The Manager reads it for a healing peer only: the hand-off has begun.
        if self.kill_on_hand_off is not None and self.manager.current_step() >= self.kill_on_hand_off:
            kill_group()
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


def group_store(args: argparse.Namespace) -> Any:
    """The replica group's TCPStore: hosted by its rank 0 (which writes its port to
    ``--group-store`` for the others), a client of it on the other ranks."""
    if args.group_rank == 0:
        store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        if args.group_size > 1:
            _write_file(args.group_store, str(store.port))
        return store
    _wait_for(args.group_store)
    return torch.distributed.TCPStore("127.0.0.1", int(args.group_store.read_text()), is_master=False,
                                      wait_for_workers=False, timeout=timedelta(seconds=args.timeout))


def build_manager(args: argparse.Namespace, state: GroupState) -> tuple[Any, Any]:
    """The rank's Manager, and the TCPStore of its group (to keep alive). A group of several
    ranks also forms its own process group (gloo) to average gradients inside the group."""
    from torchft import Manager, ProcessGroupGloo

    store = group_store(args)
    timeout = timedelta(seconds=args.timeout)
    if args.group_size > 1:
        torch.distributed.init_process_group("gloo", store=torch.distributed.PrefixStore("group", store),
                                             rank=args.group_rank, world_size=args.group_size, timeout=timeout)
    manager = Manager(pg=ProcessGroupGloo(timeout=timeout), min_replica_size=1, load_state_dict=None,
                      state_dict=None, replica_id=args.replica_id, store_addr="127.0.0.1", store_port=store.port,
                      rank=args.group_rank, world_size=args.group_size, lighthouse_addr=args.lighthouse,
                      hostname="127.0.0.1",
                      use_async_quorum=args.async_quorum, timeout=timeout,
                      # ManagedLoader refuses init_sync=True with async quorum; torchft's recipe keeps its default
                      init_sync=not (args.async_quorum and args.data == "dist-resume"),
                      quorum_timeout=2 * timeout, connect_timeout=timeout)
    manager.register_state_dict_fn("train", state.load_state_dict, state.state_dict)
    return manager, store


def average_in_group(model: nn.Module, group_size: int) -> None:
    """Average the gradients over the ranks of this replica group (as DDP inside a group would)."""
    if group_size == 1:
        return
    for parameter in model.parameters():
        torch.distributed.all_reduce(parameter.grad)
        parameter.grad /= group_size


def sampler_batches(args: argparse.Namespace, dataset: SyntheticDataset):
    """torchft's own recipe, each batch with its epoch: a static shard per group
    (``replica_rank`` from the group's id)."""
    from torchft.data import DistributedSampler

    sampler = DistributedSampler(dataset, replica_rank=int(args.replica_id.lstrip("g")),
                                 num_replica_groups=args.replica_groups, group_rank=args.group_rank,
                                 num_replicas=args.group_size,
                                 shuffle=True, seed=args.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                                         num_workers=args.num_workers)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            yield epoch, batch


def managed_batches(managed: ManagedLoader, epochs: int):
    """``ManagedLoader``'s steps of ``epochs`` epochs, each with its epoch."""
    while managed.epoch < epochs:
        for batch in managed:
            yield managed.epoch, batch


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    torch.manual_seed(args.seed)  # every group starts from the same model
    dataset = SyntheticDataset(args.dataset_size)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    group_state = GroupState(model, optimizer, args.kill_on_hand_off)
    manager, _store = build_manager(args, group_state)
    group_state.manager = manager
    if args.gradients == "ddp":
        from torchft.ddp import DistributedDataParallel

        model = DistributedDataParallel(manager, model)
    records = _Records(args.records, args.replica_id, EpochPositions(args.dataset_size, args.seed, True))
    if args.data == "dist-resume":
        loader = ResumableDataLoader(dataset, batch_size=args.batch_size, shuffle=True, seed=args.seed,
                                     num_workers=args.num_workers, rank=args.group_rank,
                                     world_size=args.group_size)
        managed = ManagedLoader(loader, manager)
        checkpoint_state = {"train": TrainState(model, optimizer), "loader": managed}
        if args.resume:
            resumed = load_checkpoint(checkpoint_state, args.resume)
            manager.load_state_dict({"step": resumed or 0, "batches_committed": 0})
        batches = managed_batches(managed, args.epochs)
    else:
        checkpoint_state = None
        batches = sampler_batches(args, dataset)
    records.write(event="up", step=manager.current_step())
    if args.ready_file:
        _write_file(args.ready_file)
    if args.start_file:
        _wait_for(args.start_file)
    loss_fn = nn.CrossEntropyLoss()
    while True:
        try:
            epoch, batch = next(batches)
        except StopIteration:
            break
        if args.data == "torchft-sampler":
            manager.start_quorum()  # as torchft's OptimizerWrapper.zero_grad does, after the batch
        served = time.time()
        step, participants = manager.current_step(), manager.num_participants()
        rank, taking_part = manager.participating_rank(), manager.is_participating()
        loss = loss_fn(model(batch[0]), batch[1])
        if step == args.kill_at_step:
            kill_group()
        loss.backward()
        average_in_group(model, args.group_size)
        if args.gradients == "allreduce":
            allreduce_gradients(manager, model)
        committed = manager.should_commit()
        if committed:
            optimizer.step()
        optimizer.zero_grad()
        records.step(epoch, batch, served, committed, taking_part, participants, rank, step,
                     (args.group_rank, args.group_size))
        if committed and checkpoint_state and args.checkpoint and manager.current_step() % args.save_every == 0:
            save_checkpoint(checkpoint_state, args.checkpoint, manager.current_step())
        hold = manager.current_step()
        if hold in args.hold_at_step and args.hold_prefix:
            args.hold_at_step.remove(hold)
            _write_file(Path(f"{args.hold_prefix}-{hold}.held"))
            _wait_for(Path(f"{args.hold_prefix}-{hold}.release"))
    records.write(event="done", step=manager.current_step())
    manager.shutdown(wait=False)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
