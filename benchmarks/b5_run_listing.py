"""B5L: finding the latest step and listing a long run on S3, with and without the run's
index of committed steps (``.commits/``), side by side in one run.

A run of ``steps`` committed steps on a moto server (127.0.0.1): one real save, its files
copied server-side under every step with a marker and an index entry of that step. Then,
repeated in turn: ``load_checkpoint`` of the latest step and ``list_checkpoints``, first with
the index, then with the index deleted (how every run was stored before it existed), then
with the index restored.
"""

from __future__ import annotations

import json
import logging
import posixpath
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from dist_resume.checkpoint.commit_index import Summary, entry_name, marker_md5
from dist_resume.checkpoint.load import list_checkpoints, load_checkpoint
from dist_resume.checkpoint.save import save_checkpoint

from .report import FigureResult
from .timing import Stats

_CREDENTIALS = {"key": "bench", "secret": "bench-secret"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _build_run(fs: Any, options: dict[str, Any], url: str, run: str, steps: int) -> None:
    save_checkpoint({"weights": torch.zeros(4)}, url, 0, storage_options=options)
    step0 = posixpath.join(run, "step_00000000")
    marker = json.loads(fs.cat_file(posixpath.join(step0, ".committed")))
    files = [path for path in fs.find(step0) if not path.endswith(".committed")]
    size = sum(fs.info(path)["size"] for path in fs.find(step0))

    def store(step: int) -> None:
        name = f"step_{step:08d}"
        for path in files:
            fs.copy(path, path.replace("step_00000000", name, 1))
        stepped = json.dumps({**marker, "step": step}).encode()
        fs.pipe_file(posixpath.join(run, name, ".committed"), stepped)
        entry = entry_name(name, Summary(marker["world_size"], size, marker["committed_at"], marker_md5(stepped)))
        fs.pipe_file(posixpath.join(run, ".commits", entry), json.dumps({**marker, "step": step, "size_bytes": size}).encode())

    with ThreadPoolExecutor(16) as pool:  # building the run is not what is measured
        for done, _ in enumerate(pool.map(store, range(1, steps)), start=2):
            if done % 200 == 0:
                print(f"  B5L: {done} of {steps} steps stored", flush=True)


def measure(steps: int, reps: int) -> dict[tuple[str, str], list[float]]:
    import boto3
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        options = {**_CREDENTIALS, "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=_CREDENTIALS["key"],
                     aws_secret_access_key=_CREDENTIALS["secret"]).create_bucket(Bucket="bench")
        fs = s3fs.S3FileSystem(**options)
        url, run = "s3://bench/run", "bench/run"
        _build_run(fs, options, url, run, steps)
        index = {path: fs.cat_file(path) for path in fs.find(posixpath.join(run, ".commits"))}
        timings: dict[tuple[str, str], list[float]] = {}
        for _ in range(reps):
            for case in ("with the index", "without the index"):
                if case == "without the index":
                    fs.rm(list(index))
                for series, call in (
                    ("load_checkpoint (latest)", lambda: load_checkpoint({"weights": torch.zeros(4)}, url,
                                                                         storage_options=options)),
                    ("list_checkpoints", lambda: list_checkpoints(url, storage_options=options)),
                ):
                    began = time.perf_counter()
                    call()
                    timings.setdefault((case, series), []).append(time.perf_counter() - began)
                if case == "without the index":
                    for path, data in index.items():
                        fs.pipe_file(path, data)
        return timings
    finally:
        server.stop()


def run(quick: bool) -> list[FigureResult]:
    steps, reps = (300, 2) if quick else (1100, 3)
    found = measure(steps, reps)
    result = FigureResult("B5L", f"latest step and listing of a run of {steps} steps on S3 (moto), lower is better", "s")
    for (case, series), values in found.items():
        result.add(case, series, Stats.of(values))
    # The latest step is found by the run's listing and the newest marker, index or not.
    for case in ("with the index", "without the index"):
        took = result.value(case, "load_checkpoint (latest)").median
        result.check(f"load_checkpoint (latest) {case}, seconds", took, "< 1", took < 1)
    series = "list_checkpoints"
    ratio = result.value("with the index", series).median / result.value("without the index", series).median
    result.check(f"{series}: with / without the index", ratio, "<= 0.5", ratio <= 0.5)
    took = result.value("with the index", series).median
    result.check(f"{series} with the index, seconds", took, "< 1", took < 1)
    result.notes.append(
        "Finding the latest step: the run's listing and the newest step's marker, with or without the index, "
        "and the listing of the step directories' markers (which steps were committed when the job loaded: "
        "what a later save that finds its step taken says). "
        "list_checkpoints with the index: three listings (the run; .commits/; the step directories' markers, "
        "their attempts rolled up), and a step whose marker's ETag is the MD5 its entry's name recorded is taken "
        "from that name, no file read. Without it: every step's marker read and its files listed.")
    return [result]
