"""One rank of the kill campaign's training job (DDP + ResumableDataLoader + checkpoints).

``python -m tests.faults.kill_worker <json args>`` with RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT set. It resumes from the latest committed checkpoint, records every batch it
trains on (``record/run<R>-rank<r>.txt``: step, epoch, padding, indices), saves every
``save_every`` steps (synchronous and asynchronous in turn), and, when ``kill`` is given,
stops at that moment, writes ``ready`` and waits for SIGKILL:

- ``training`` / ``workers_busy``: after training step start+offset (``workers_busy`` runs
  with 2 DataLoader workers, whose prefetch is then in flight);
- ``sync_save`` / ``async_save``: rank ``victim`` blocks in the middle of its shard of the
  first save at or after start+offset (the asynchronous one while training goes on);
- ``after_commit``: right after the first save at or after start+offset returned.
"""

from __future__ import annotations

import json
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.kill_points import BlockingFileSystem, wait_for_kill


def main(args: dict[str, Any]) -> None:
    import fsspec
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from dist_resume import (
        ResumableDataLoader,
        TrainState,
        load_checkpoint,
        save_checkpoint,
    )
    from tests.datasets import Indices

    warnings.filterwarnings("ignore")
    fsspec.register_implementation("killblock", BlockingFileSystem, clobber=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    kind, offset, victim = args["kill"] or (None, 0, -1)
    url = f"killblock://{args['dir']}"
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(1, 2))
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = ResumableDataLoader(Indices(args["dataset_len"]), batch_size=args["batch_size"], shuffle=True,
                                 seed=args["seed"], num_workers=2 if kind == "workers_busy" else 0)
    state = {"app": TrainState(model, optim), "loader": loader}
    step = start = load_checkpoint(state, url) or 0
    out = Path(args["record"])
    if rank == 0:
        (out / f"run{args['run']}-start.txt").write_text(str(start))
    target = start + offset
    handle = None
    with open(out / f"run{args['run']}-rank{rank}.txt", "w") as record:
        while loader.epoch < args["epochs"]:
            epoch = loader.epoch
            padding = len(loader.padding_positions())
            for batch in loader:
                model(batch.float().unsqueeze(1) / 100).pow(2).sum().backward()
                optim.step()
                optim.zero_grad()
                step += 1
                final = loader.epoch != epoch
                record.write(f"{step} {epoch} {padding if final else 0} {','.join(map(str, batch.tolist()))}\n")
                record.flush()
                if kind in ("training", "workers_busy") and step == target:
                    wait_for_kill(args["ready"], step)
                if step % args["save_every"]:
                    continue
                armed = kind in ("sync_save", "async_save") and step >= target and rank == victim
                BlockingFileSystem.ready = args["ready"] if armed else None
                asynchronous = kind == "async_save" if kind in ("sync_save", "async_save") and step >= target \
                    else (step // args["save_every"]) % 2 == 1
                handle = save_checkpoint(state, url, step, async_save=asynchronous, keep=args["keep"])
                if kind == "after_commit" and step >= target:
                    if handle is not None:
                        handle.result()  # committed
                    wait_for_kill(args["ready"], step)
    if handle is not None:
        handle.result()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
