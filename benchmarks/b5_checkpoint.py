"""Time save_checkpoint against plain baselines, side by side, interleaved, medians.

    python benchmarks/checkpoint_save.py [--mb 200] [--reps 5] [--dir /tmp/ckpt-bench]

Two gloo ranks each own half of ~``--mb`` MB of float32 model state (distinct tensors, as
with sharded training). Per repetition, in turn:

- ``save_checkpoint`` to a local directory, vs each rank ``torch.save`` of its tensors;
- ``save_checkpoint`` to ``s3://`` on a moto server (127.0.0.1), vs each rank putting the
  same ``torch.save`` bytes with s3fs;
- ``save_checkpoint`` with a ResumableDataLoader in the state, and of the loader alone,
  to size the loader's cost.

``save_checkpoint`` fsyncs every file on local disks (a commit must be durable); the
``torch.save+fsync`` line is the baseline with the same durability.

Each timing runs from a barrier to a barrier (the slower rank counts). Prints medians.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import socket
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dist_resume.checkpoint import list_checkpoints, save_checkpoint  # noqa: E402
from dist_resume.loader import ResumableDataLoader  # noqa: E402

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


def _rank(rank: int, args: argparse.Namespace, port: int, endpoint: str, results: dict) -> None:
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), AWS_ENDPOINT_URL=endpoint,
                      AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret", AWS_DEFAULT_REGION="us-east-1")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    import s3fs

    fs = s3fs.S3FileSystem()
    per_rank = args.mb * 2**20 // WORLD_SIZE // 4  # float32 elements
    tensors = {f"layer{i}.rank{rank}": torch.randn(per_rank // 8) for i in range(8)}
    state = {"model": tensors}
    loader = ResumableDataLoader(list(range(100_000)), batch_size=32, shuffle=True)
    next(iter(loader))
    local = Path(args.dir)

    def torch_save_fsync() -> None:
        with open(local / f"plain{rank}-{step}.pt", "wb") as file:
            torch.save(tensors, file)
            file.flush()
            os.fsync(file.fileno())

    def plain_bytes() -> bytes:
        buffer = io.BytesIO()
        torch.save(tensors, buffer)
        return buffer.getvalue()

    timings: dict[str, list[float]] = {}
    for rep in range(args.reps):
        step = rep + 1
        runs = {
            "save_checkpoint local": lambda: save_checkpoint(state, str(local / "dcp"), step),
            "torch.save per rank local": lambda: torch.save(tensors, local / f"plain{rank}-{step}.pt"),
            "torch.save+fsync per rank local": torch_save_fsync,
            "save_checkpoint s3 (moto)": lambda: save_checkpoint(state, "s3://bench/dcp", step),
            "s3fs put per rank (moto)": lambda: fs.pipe_file(f"bench/plain/{rank}-{step}.pt", plain_bytes()),
            "save_checkpoint local +loader": lambda: save_checkpoint({**state, "loader": loader},
                                                                     str(local / "dcp-loader"), step),
            "save_checkpoint local loader only": lambda: save_checkpoint({"loader": loader},
                                                                         str(local / "loader-only"), step),
        }
        for name, run in runs.items():
            timings.setdefault(name, []).append(_timed(run))
        if rank == 0:  # keep the disk and moto's memory flat
            for path in local.glob("plain*"):
                path.unlink()
            fs.rm("bench/plain", recursive=True)
        if rep < args.reps - 1:
            dist.barrier()
            if rank == 0:
                for name in ("dcp", "dcp-loader", "loader-only"):
                    shutil.rmtree(local / name)
                fs.rm("bench/dcp", recursive=True)
            dist.barrier()
    if rank == 0:
        results.update({name: statistics.median(values) for name, values in timings.items()})
        sizes = {info.step: info.size_bytes for info in list_checkpoints(str(local / "dcp"))}
        sizes_loader = {info.step: info.size_bytes for info in list_checkpoints(str(local / "dcp-loader"))}
        results["bytes"] = sizes[args.reps]
        results["bytes +loader"] = sizes_loader[args.reps]
        results["bytes loader only"] = list_checkpoints(str(local / "loader-only"))[-1].size_bytes
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="total model state in MB (default 200)")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions (default 5)")
    parser.add_argument("--dir", default="/tmp/dist-resume-bench", help="local directory (emptied)")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    Path(args.dir).mkdir(parents=True)

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
    # moto serves from this process: the ranks run in spawned processes
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(args, _free_port(), endpoint, results), nprocs=WORLD_SIZE)
        results = dict(results)
    server.stop()
    shutil.rmtree(args.dir, ignore_errors=True)

    print(f"{args.mb} MB of model state over {WORLD_SIZE} ranks, median of {args.reps} interleaved runs")
    for name in ("save_checkpoint local", "torch.save per rank local", "torch.save+fsync per rank local",
                 "save_checkpoint s3 (moto)", "s3fs put per rank (moto)", "save_checkpoint local +loader",
                 "save_checkpoint local loader only"):
        print(f"  {name:34s} {results[name]:7.3f} s")
    print(f"  ratio local  save_checkpoint / torch.save : {results['save_checkpoint local'] / results['torch.save per rank local']:.2f}")
    print(f"  ratio local  save_checkpoint / torch.save+fsync : {results['save_checkpoint local'] / results['torch.save+fsync per rank local']:.2f}")
    print(f"  ratio s3     save_checkpoint / s3fs put   : {results['save_checkpoint s3 (moto)'] / results['s3fs put per rank (moto)']:.2f}")
    print(f"  loader state: +{results['bytes +loader'] - results['bytes']} bytes, "
          f"+{results['save_checkpoint local +loader'] - results['save_checkpoint local']:.3f} s; "
          f"a checkpoint of the loader alone: {results['bytes loader only']} bytes, "
          f"{results['save_checkpoint local loader only']:.3f} s")


if __name__ == "__main__":
    main()
