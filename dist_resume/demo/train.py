"""A small but complete DDP training job that resumes exactly where it stopped.

Run it with torchrun (see ``launch/``)::

    torchrun --nproc-per-node 2 launch/train.py --checkpoint ./runs/ckpt --epochs 2

It loads the latest committed checkpoint at start-up (none on the first start), trains a
small classifier on a synthetic dataset with a random augmentation, saves a checkpoint
every ``--save-every`` steps and at the end, and logs loss and throughput on rank 0.
Kill it at any moment and start it again, at the same or another number of processes:
it continues on the exact next sample (GUARANTEES G1-G4).

``--record DIR`` writes what every rank trained on (see ``dist_resume.demo.records``);
``--pause-at-step N --pause-file F`` makes the job write ``F`` (JSON: step, worker pids)
once every rank has trained step N, then wait to be killed, or until ``F.resume`` exists
(then it trains on); a job that reaches step N when ``F`` already exists does not pause, so
an elastic restart runs through. ``--pause-at-step`` may be given several times when ``F``
holds ``{step}``, which each pause replaces with its step.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from dist_resume import (
    ResumableDataLoader,
    TrainState,
    load_checkpoint,
    save_checkpoint,
    shut_down_distributed,
)
from dist_resume.demo.data import SyntheticDataset, make_model
from dist_resume.demo.records import EpochPositions, Recorder, start_run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=os.environ.get("CHECKPOINT_URL"),
                        help="checkpoint URL: path, file://, s3://... (default: $CHECKPOINT_URL)")
    parser.add_argument("--epochs", type=int, default=2)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--batch-size", type=int, help="per-rank batch size (default 8)")
    size.add_argument("--global-batch", type=int,
                      help="global batch size, split evenly over the ranks (keeps steps identical across world sizes)")
    parser.add_argument("--dataset-size", type=int, default=1000)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--save-every", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--keep", type=int, default=None, help="keep only the newest N checkpoints")
    parser.add_argument("--log-every", type=int, default=10, help="log loss and throughput every N steps")
    parser.add_argument("--record", metavar="DIR", help="record what every rank trains on, for verification")
    parser.add_argument("--pause-at-step", type=int, action="append", metavar="N",
                        help="test hook, see the module docstring")
    parser.add_argument("--pause-file", metavar="FILE", help="test hook, see the module docstring")
    args = parser.parse_args(argv)
    if not args.checkpoint:
        parser.error("no checkpoint location: give --checkpoint URL or set CHECKPOINT_URL")
    for name in ("epochs", "dataset_size", "save_every", "log_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if (args.pause_at_step is None) != (args.pause_file is None):
        parser.error("--pause-at-step and --pause-file go together")
    if args.pause_at_step and len(args.pause_at_step) > 1 and "{step}" not in args.pause_file:
        parser.error("several --pause-at-step need a --pause-file that holds {step}")
    return args


def per_rank_batch(args: argparse.Namespace, world_size: int) -> int:
    """The per-rank batch size from --batch-size, or --global-batch split over the ranks."""
    if args.global_batch is None:
        batch = 8 if args.batch_size is None else args.batch_size
    elif args.global_batch % world_size:
        raise SystemExit(f"--global-batch {args.global_batch} does not split over {world_size} ranks")
    else:
        batch = args.global_batch // world_size
    if batch < 1:
        raise SystemExit(f"the per-rank batch size must be >= 1, got {batch}")
    return batch


def pause_if_asked(args: argparse.Namespace, step: int, rank: int) -> None:
    """The test hook: at a --pause-at-step, write its --pause-file (unless it exists) and wait
    until killed, or until ``<pause file>.resume`` exists."""
    if step not in (args.pause_at_step or ()):
        return
    pause_file = args.pause_file.replace("{step}", str(step))
    decision = [rank == 0 and not os.path.exists(pause_file)]
    dist.broadcast_object_list(decision, src=0)  # every rank takes rank 0's decision
    if not decision[0]:
        return
    pids: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())
    if rank == 0:
        partial = f"{pause_file}.partial"
        with open(partial, "w") as file:
            json.dump({"step": step, "pids": pids}, file)
        os.replace(partial, pause_file)
    while not os.path.exists(f"{pause_file}.resume"):  # until killed, or resumed
        time.sleep(0.1)


def init_distributed(backend: str) -> None:
    """init_process_group from torchrun's environment. Under the elastic agent's store, the
    keys go in a namespace of this restart: the agent keeps one store across restarts, and a
    restarted rank could otherwise read the address of a dead peer of the previous attempt."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend)
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(minutes=5))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"dist_resume/attempt_{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    init_distributed("nccl" if torch.cuda.is_available() else "gloo")
    train(args)
    gc.collect()  # DDP sits in a reference cycle: free it and its reference to the process group now
    shut_down_distributed()


def train(args: argparse.Namespace) -> None:
    """Resume from the latest committed checkpoint, train ``args.epochs`` epochs, commit the end."""
    cuda = torch.cuda.is_available()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    batch_size = per_rank_batch(args, world_size)

    dataset = SyntheticDataset(args.dataset_size)
    loader = ResumableDataLoader(dataset, batch_size=batch_size, shuffle=True, seed=args.seed,
                                 num_workers=args.num_workers, pin_memory=cuda)
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(make_model().to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    state = {"app": TrainState(model, optimizer), "loader": loader}

    step = load_checkpoint(state, args.checkpoint) or 0
    saved = step
    recorder = None
    if args.record:
        run = [start_run(args.record, world_size, batch_size, step) if rank == 0 else 0]
        dist.broadcast_object_list(run, src=0)
        recorder = Recorder(args.record, run[0], rank, EpochPositions(len(dataset), args.seed, True))
    if rank == 0:
        where = f"resumed from step {step}" if step else "starting fresh"
        print(f"[train] {world_size} ranks x batch {batch_size}, epoch {loader.epoch}, {where}", flush=True)

    loss_fn = nn.CrossEntropyLoss()
    window_start, window_samples = time.perf_counter(), 0
    while loader.epoch < args.epochs:
        epoch = loader.epoch
        padding = len(loader.padding_positions())  # repeated in this rank's final batch (G2)
        for features, labels, indices in loader:
            loss = loss_fn(model(features.to(device)), labels.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            window_samples += len(indices) * world_size
            if recorder is not None:
                final = loader.epoch != epoch  # the loader moved on: this was the epoch's last batch
                recorder.write(step, epoch, indices.tolist(), features, padding if final else 0, loss.item())
            if step % args.save_every == 0:
                save_checkpoint(state, args.checkpoint, step, keep=args.keep)
                saved = step
            if rank == 0 and step % args.log_every == 0:
                elapsed = time.perf_counter() - window_start
                print(f"[train] step {step} epoch {epoch} loss {loss.item():.4f} "
                      f"{window_samples / elapsed:.0f} samples/s", flush=True)
                window_start, window_samples = time.perf_counter(), 0
            pause_if_asked(args, step, rank)
    if saved != step:
        save_checkpoint(state, args.checkpoint, step, keep=args.keep)
    if rank == 0:
        print(f"[train] done: {args.epochs} epochs, step {step} committed", flush=True)
    if recorder is not None:
        recorder.close()


if __name__ == "__main__":
    main()
