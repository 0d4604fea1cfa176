"""B5: save_checkpoint against plain baselines, side by side, interleaved.

Two gloo ranks each own half of ~``mb`` MB of float32 model state (distinct tensors, as
with sharded training). Per repetition, in turn:

- ``save_checkpoint`` to a local directory, vs each rank ``torch.save`` of its tensors;
- ``save_checkpoint`` to ``s3://`` on a moto server (127.0.0.1), vs each rank putting the
  same ``torch.save`` bytes with s3fs;
- ``save_checkpoint`` with a ResumableDataLoader in the state, and of the loader alone,
  to size the loader's cost.

``save_checkpoint`` fsyncs every file on local disks (a commit must be durable); the
``torch.save+fsync`` line is the baseline with the same durability.

Each timing runs from a barrier to a barrier (the slower rank counts).
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dist_resume.checkpoint.load import list_checkpoints
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.loader.resumable import ResumableDataLoader

from .report import FigureResult
from .timing import Stats

WORLD_SIZE = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _timed(fn) -> float:
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def _rank(rank: int, mb: int, reps: int, directory: str, port: int, endpoint: str, results: dict) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), AWS_ENDPOINT_URL=endpoint,
                      AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    import s3fs

    fs = s3fs.S3FileSystem()
    per_rank = mb * 2**20 // WORLD_SIZE // 4  # float32 elements
    tensors = {f"layer{i}.rank{rank}": torch.randn(per_rank // 8) for i in range(8)}
    state = {"model": tensors}
    loader = ResumableDataLoader(list(range(100_000)), batch_size=32, shuffle=True)
    next(iter(loader))
    local = Path(directory)

    def torch_save_fsync() -> None:
        with open(local / f"plain{rank}-{step}.pt", "wb") as file:
            torch.save(tensors, file)
            file.flush()
            os.fsync(file.fileno())

    def plain_bytes() -> bytes:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        return buffer.getvalue()

    timings: dict[tuple[str, str], list[float]] = {}
    for rep in range(reps):
        step = rep + 1
        runs = {  # (storage, what) -> run
            ("local", "save_checkpoint"): lambda: save_checkpoint(state, str(local / "dcp"), step),
            ("local", "torch.save per rank"): lambda: torch.save(tensors, local / f"plain{rank}-{step}.pt"),
            ("local", "torch.save+fsync per rank"): torch_save_fsync,
            ("s3 (moto)", "save_checkpoint"): lambda: save_checkpoint(state, "s3://bench/dcp", step),
            ("s3 (moto)", "s3fs put per rank"): lambda: fs.pipe_file(f"bench/plain/{rank}-{step}.pt", plain_bytes()),
            ("local", "save_checkpoint +loader"): lambda: save_checkpoint({**state, "loader": loader},
                                                                          str(local / "dcp-loader"), step),
            ("local", "save_checkpoint of the loader only"): lambda: save_checkpoint({"loader": loader},
                                                                                     str(local / "loader-only"), step),
        }
        for name, run in runs.items():
            timings.setdefault(name, []).append(_timed(run))
        if rank == 0:  # keep the disk and moto's memory flat
            for path in local.glob("plain*"):
                path.unlink()
            fs.rm("bench/plain", recursive=True)
        if rep < reps - 1:
            dist.barrier()
            if rank == 0:
                for name in ("dcp", "dcp-loader", "loader-only"):
                    shutil.rmtree(local / name)
                fs.rm("bench/dcp", recursive=True)
            dist.barrier()
    if rank == 0:
        results.update(timings)
        sizes = {info.step: info.size_bytes for info in list_checkpoints(str(local / "dcp"))}
        sizes_loader = {info.step: info.size_bytes for info in list_checkpoints(str(local / "dcp-loader"))}
        results["bytes"] = sizes[reps]
        results["bytes +loader"] = sizes_loader[reps]
        results["bytes loader only"] = list_checkpoints(str(local / "loader-only"))[-1].size_bytes
    dist.barrier()
    dist.destroy_process_group()


def measure(mb: int, reps: int) -> dict[str, Any]:
    """Seconds of each run per repetition (lists, by (storage, what)) and checkpoint sizes
    (by "bytes ..." names)."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    s3_port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{s3_port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                 aws_secret_access_key="bench-secret").create_bucket(Bucket="bench")
    try:
        with tempfile.TemporaryDirectory(prefix="dist-resume-bench-") as directory, mp.Manager() as manager:
            # moto serves from this process: the ranks run in spawned processes
            results = manager.dict()
            mp.spawn(_rank, args=(mb, reps, directory, _free_port(), endpoint, results), nprocs=WORLD_SIZE)
            return dict(results)
    finally:
        server.stop()


def run(quick: bool) -> list[FigureResult]:
    mb, reps = (64, 3) if quick else (200, 5)
    found = measure(mb, reps)
    title = f"checkpoint save, {mb} MB of model state over {WORLD_SIZE} ranks (lower is better)"
    result = FigureResult("B5", title, "s")
    for key, values in found.items():
        if isinstance(key, tuple):
            result.add(*key, Stats.of(values))
    ours_local = result.value("local", "save_checkpoint").median
    for baseline in ("torch.save per rank", "torch.save+fsync per rank"):
        ratio = ours_local / result.value("local", baseline).median
        result.check(f"local: save_checkpoint / {baseline}", ratio, "<= 1.25", ratio <= 1.25)
    ratio = result.value("s3 (moto)", "save_checkpoint").median / result.value("s3 (moto)", "s3fs put per rank").median
    result.check("s3: save_checkpoint / s3fs put per rank", ratio, "<= 1.25", ratio <= 1.25)
    result.notes += [
        f"Checkpoint of the model: {found['bytes']:,} B; with the loader: {found['bytes +loader']:,} B; "
        f"of the loader alone: {found['bytes loader only']:,} B.",
        "save_checkpoint fsyncs every file (a commit must be durable): torch.save+fsync is the baseline "
        "with the same durability. Each timing runs from a barrier to a barrier.",
    ]
    return [result]
