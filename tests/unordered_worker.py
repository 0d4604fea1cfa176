"""One rank of a real gloo job with in_order=False and stragglers, for the kill test.

Run by ``tests.checkpoint_worker.launch`` with this file as the script. Results go to JSON
files in ``args["out"]``; the training job waits to be killed once it wrote ``paused-<rank>``.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any


def _setup() -> int:
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    return dist.get_rank()


def _loader(dataset: Any, num_workers: int) -> Any:
    from dist_resume import ResumableDataLoader

    # shuffle off: positions are the indices; even_batches=False: no padding, so "every
    # sample exactly once" is exact equality.
    return ResumableDataLoader(dataset, batch_size=4, num_workers=num_workers, in_order=False, seed=11,
                               even_batches=False)


def train_and_wait(args: dict[str, Any]) -> None:
    """Rank r's batch 0 holds a straggler that waits for a gate opened only after the save:
    the checkpoint holds delivered batches beyond the consumed prefix. Then train on and wait
    to be killed."""
    import torch
    import torch.distributed as dist

    from dist_resume import save_checkpoint
    from tests.unordered_datasets import Gated

    rank = _setup()
    out = Path(args["out"])
    gate = multiprocessing.Event()
    loader = _loader(Gated(args["dataset_len"], {rank * 4 + 1}, gate), num_workers=2)
    consumed: list[list[int]] = []
    iterator = iter(loader)
    for step in range(1, args["save_step"] + args["after_save"] + 1):
        batch = next(iterator)
        dist.all_reduce(batch[1].sum().reshape(1))  # a training step, in lockstep
        if step <= args["save_step"]:
            consumed.append(batch[0].tolist())
        if step == args["save_step"]:
            save_checkpoint({"loader": loader}, args["url"], step)
            (out / f"consumed-before-{rank}.json").write_text(json.dumps(consumed))
            gate.set()
    (out / f"paused-{rank}").write_text("")
    time.sleep(300)  # SIGKILL arrives here


def resume(args: dict[str, Any]) -> None:
    from dist_resume import load_checkpoint
    from tests.unordered_datasets import Gated

    rank = _setup()
    loader = _loader(Gated(args["dataset_len"], set(), None), num_workers=1)
    assert load_checkpoint({"loader": loader}, args["url"]) == args["save_step"]
    consumed = [batch[0].tolist() for batch in loader]
    (Path(args["out"]) / f"consumed-after-{rank}.json").write_text(json.dumps(consumed))


def _stream_loader(args: dict[str, Any], slow: set[int], gate: Any, num_workers: int) -> Any:
    from dist_resume import ResumableDataLoader
    from dist_resume.streams import ShardedStream
    from tests.unordered_datasets import GatedReader

    # shuffle off, window 1: the epoch's items are the shards' in order; lengths given:
    # counting would read the stragglers.
    stream = ShardedStream(args["shards"], GatedReader(slow, gate), shuffle=False, window=1,
                           lengths=[args["shard_items"]] * len(args["shards"]))
    return ResumableDataLoader(stream, batch_size=3, num_workers=num_workers, in_order=False, even_batches=False)


def _train_and_stop(args: dict[str, Any], loader: Any, gate: Any) -> None:
    """Train ``args["save_step"]`` steps in lockstep, save, open the gate, train one step more
    and stop (the state taken at the save is what a kill leaves)."""
    import torch
    import torch.distributed as dist

    from dist_resume import save_checkpoint

    consumed: list[list[int]] = []
    iterator = iter(loader)
    for _ in range(args["save_step"]):
        batch = next(iterator)
        dist.all_reduce(torch.ones(1))  # a training step, in lockstep
        consumed.append(batch.tolist())
    save_checkpoint({"loader": loader}, args["url"], args["save_step"])
    (Path(args["out"]) / f"consumed-before-{dist.get_rank()}.json").write_text(json.dumps(consumed))
    gate.set()
    next(iterator)  # trained after the save: not in the checkpoint
    del iterator


def _resume_and_finish(args: dict[str, Any], loader: Any) -> None:
    import torch.distributed as dist

    from dist_resume import load_checkpoint

    assert load_checkpoint({"loader": loader}, args["url"]) == args["save_step"]
    consumed = [batch.tolist() for batch in loader]
    (Path(args["out"]) / f"consumed-after-{dist.get_rank()}.json").write_text(json.dumps(consumed))


def stream_train_and_stop(args: dict[str, Any]) -> None:
    """A ShardedStream: each rank's worker role 0 starts with an item held by a gate opened
    only after the save, so the checkpoint holds role 1's batches alone."""
    rank = _setup()
    gate = multiprocessing.Event()
    first = rank * len(args["shards"]) // 2 * 1000  # the first item of this rank's role 0
    _train_and_stop(args, _stream_loader(args, {first}, gate, num_workers=2), gate)


def stream_resume(args: dict[str, Any]) -> None:
    _setup()
    _resume_and_finish(args, _stream_loader(args, set(), None, num_workers=1))


def _mixture_loader(args: dict[str, Any], slow: set[int], gate: Any, num_workers: int) -> Any:
    from dist_resume import Mixture, ResumableDataLoader
    from dist_resume.streams import ShardedStream
    from tests.unordered_datasets import GatedReader

    sources = {name: ShardedStream(shards, GatedReader(slow, gate), shuffle=False, window=1,
                                   lengths=[args["shard_items"]] * len(shards))
               for name, shards in args["sources"].items()}
    mixture = Mixture(sources, args["weights"], args["length"])
    return ResumableDataLoader(mixture, batch_size=args["batch_size"], num_workers=num_workers, in_order=False,
                               seed=5, even_batches=False)


def mixture_train_and_stop(args: dict[str, Any]) -> None:
    """A Mixture of two ShardedStreams: rank 0's worker role 0 starts with an item held by a
    gate opened only after the save, so the checkpoint holds role 1's batches alone on rank 0."""
    rank = _setup()
    gate = multiprocessing.Event()
    _train_and_stop(args, _mixture_loader(args, {args["straggler"]} if rank == 0 else set(), gate, num_workers=2), gate)


def mixture_resume(args: dict[str, Any]) -> None:
    _setup()
    _resume_and_finish(args, _mixture_loader(args, set(), None, num_workers=1))


SCENARIOS = {f.__name__: f for f in (train_and_wait, resume, stream_train_and_stop, stream_resume,
                                     mixture_train_and_stop, mixture_resume)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](json.loads(sys.argv[2]))
    from dist_resume import shut_down_distributed

    shut_down_distributed()
