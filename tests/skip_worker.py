"""Ranks of real gloo jobs that call `loader.skip`, and a dataset that logs every read.

Run through ``tests.checkpoint_worker.run(scenario, world_size, args, port, script=__file__)``;
results go to files in ``args["out"]``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class ReadLog(Dataset):
    """Sample `i` is `i`; every read appends `i` to `path`, from any process (worker
    processes included): a line of a few bytes in O_APPEND mode is one atomic write."""

    def __init__(self, length: int, path: str) -> None:
        self.length = length
        self.path = path

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        descriptor = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(descriptor, f"{index}\n".encode())
        finally:
            os.close(descriptor)
        return index


def reads(path: str | Path) -> list[int]:
    """Every index read so far, in the order of the reads."""
    path = Path(path)
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _loader(args: dict[str, Any], rank: int, world_size: int):
    from dist_resume.loader.resumable import ResumableDataLoader

    log = str(Path(args["out"]) / f"reads-{args['phase']}-{rank}.log")
    return ResumableDataLoader(ReadLog(args["dataset_len"], log), batch_size=args["batch_size"], shuffle=True,
                               seed=7, even_batches=False, num_workers=args["num_workers"], rank=rank,
                               world_size=world_size)


def skip_then_save(args: dict[str, Any]) -> None:
    """Consume `before` batches, skip `skips[rank]` global batches, consume `after`, save."""
    import torch.distributed as dist

    from dist_resume.checkpoint.save import save_checkpoint
    from dist_resume.errors import CheckpointError

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    loader = _loader(args, rank, world_size)
    out = Path(args["out"])
    consumed = [i for _, batch in zip(range(args["before"]), loader) for i in batch.tolist()]
    loader.skip(args["skips"][rank])
    consumed += [i for _, batch in zip(range(args["after"]), loader) for i in batch.tolist()]
    try:
        save_checkpoint({"loader": loader}, args["url"], 1)
    except CheckpointError as error:
        (out / f"save-error-{rank}.txt").write_text(str(error))
    (out / f"consumed-save-{rank}.json").write_text(json.dumps(consumed))
    (out / f"skipped-save-{rank}.json").write_text(json.dumps([str(r) for r in loader.skipped]))


def resume_to_the_end(args: dict[str, Any]) -> None:
    """Load the checkpoint at this world size, skip `skip_after_load`, finish the epoch."""
    import torch.distributed as dist

    from dist_resume.checkpoint.load import load_checkpoint

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    loader = _loader(args, rank, world_size)
    assert load_checkpoint({"loader": loader}, args["url"]) == 1
    loader.skip(args["skip_after_load"])
    consumed = [i for batch in loader for i in batch.tolist()]
    out = Path(args["out"])
    (out / f"consumed-load-{rank}.json").write_text(json.dumps(consumed))
    (out / f"skipped-load-{rank}.json").write_text(json.dumps([str(r) for r in loader.skipped]))


def stream_phase(args: dict[str, Any]) -> None:
    """A ShardedStream read with in_order=False: load step `load` (if given), skip `skip`
    global batches, take `take` batches (None: to the epoch's end), save step `save` (if
    given). The items its transform was given go to `reads-<phase>.log`."""
    import torch.distributed as dist

    from dist_resume import ResumableDataLoader, load_checkpoint, save_checkpoint
    from dist_resume.streams import ShardedStream
    from tests.stream_jobs import read_jsonl
    from tests.unordered_datasets import RecordingTransform

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = Path(args["out"])
    stream = ShardedStream(args["shards"], read_jsonl, window=8, seed=11,
                           transform=RecordingTransform(str(out / f"reads-{args['phase']}.log")))
    loader = ResumableDataLoader(stream, batch_size=args["batch_size"], num_workers=args["num_workers"],
                                 in_order=False, even_batches=False)
    if args.get("load") is not None:
        assert load_checkpoint({"loader": loader}, args["url"]) == args["load"]
    loader.skip(args.get("skip", 0))
    consumed = []
    if args["take"] != 0:
        batches = iter(loader) if args["take"] is None else itertools.islice(loader, args["take"])
        consumed = [i for batch in batches for i in batch.tolist()]
    if args.get("save") is not None:
        save_checkpoint({"loader": loader}, args["url"], args["save"])
    (out / f"consumed-{args['phase']}-{rank}.json").write_text(json.dumps(consumed))
    (out / f"skipped-{args['phase']}-{rank}.json").write_text(json.dumps([str(r) for r in loader.skipped]))


SCENARIOS = {f.__name__: f for f in (skip_then_save, resume_to_the_end, stream_phase)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](json.loads(sys.argv[2]))
    from dist_resume import shut_down_distributed

    shut_down_distributed()
