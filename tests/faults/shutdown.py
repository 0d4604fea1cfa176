"""Shutdown campaign: the multi-node training job exits, every time.

Two torchrun agents (launch/multinode.sh, c10d rendezvous on 127.0.0.1, one process each,
as docker-compose.yml runs them) train a short job that checkpoints to S3, ``runs`` times in
a row. Every run must exit 0 on both agents within ``EXIT_BOUND`` seconds and commit its final
step. (The job used to hang at exit in gloo's process-group destructor.)

    python -m tests.faults.shutdown [--runs 20] [--store ceph|moto]

starts the S3 server itself (Ceph RGW needs ceph-mon, ceph-osd, radosgw) and writes the jobs'
logs to runs/shutdown-<time>/.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from dist_resume import list_checkpoints
from dist_resume.demo.job import JobError, TrainingJob, free_port

ROOT = Path(__file__).resolve().parents[2]
NODES = 2
DATASET_SIZE, GLOBAL_BATCH, SAVE_EVERY = 64, 8, 4
FINAL_STEP = DATASET_SIZE // GLOBAL_BATCH  # one epoch
EXIT_BOUND = 120.0  # seconds for a whole run; a run takes 10-30 s on 2 busy cores
CI_RUNS, LONG_RUNS = 2, 20  # per S3 server in CI (before the fix 1 run in 6 to 4 in 6 hung); by hand


@dataclass(frozen=True)
class RunResult:
    number: int
    seconds: float
    error: str | None  # None: both agents exited 0 in time and the final step is committed


def run_once(number: int, checkpoint: str, log_dir: Path) -> RunResult:
    """One two-node job from scratch to its end."""
    env = {"NNODES": str(NODES), "NPROC_PER_NODE": "1", "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
           "RDZV_ID": f"shutdown-{number}", "CHECKPOINT_URL": checkpoint,
           # as torchrun leaves it with one process per node: more threads, more GIL contention
           "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
    command = ["bash", str(ROOT / "launch" / "multinode.sh"), str(ROOT / "launch" / "train.py"),
               "--epochs", "1", "--dataset-size", str(DATASET_SIZE), "--global-batch", str(GLOBAL_BATCH),
               "--save-every", str(SAVE_EVERY)]
    start = time.monotonic()
    with ExitStack() as stack:
        nodes = [stack.enter_context(TrainingJob(command, log_dir / f"run{number}-node{node}.log", env))
                 for node in range(NODES)]
        try:
            for node in nodes:
                node.wait(timeout=max(0.0, start + EXIT_BOUND - time.monotonic()))
        except JobError as error:  # leaving the stack stops what still runs
            return RunResult(number, time.monotonic() - start, str(error))
    seconds = time.monotonic() - start
    steps = [info.step for info in list_checkpoints(checkpoint)]
    if steps[-1:] != [FINAL_STEP]:
        return RunResult(number, seconds, f"committed steps {steps}, expected the last to be {FINAL_STEP}")
    return RunResult(number, seconds, None)


def run(checkpoint_root: str, log_dir: Path, runs: int) -> Iterator[RunResult]:
    """``runs`` jobs in a row, each with its own checkpoint URL under ``checkpoint_root``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for number in range(runs):
        yield run_once(number, f"{checkpoint_root}/shutdown-{number}", log_dir)


@contextmanager
def _bucket_on(store: str) -> Iterator[str]:
    """An S3 bucket on a server started here; endpoint and keys go into os.environ."""
    import boto3

    from storage.ceph_rgw import ceph_rgw
    from tests.s3_server import FAKE_KEY_ID, FAKE_SECRET, moto_server

    with ExitStack() as stack:
        if store == "ceph":
            rgw = stack.enter_context(ceph_rgw())
            url, key_id, secret = rgw.url, rgw.key_id, rgw.secret
        else:
            url, key_id, secret = stack.enter_context(moto_server()), FAKE_KEY_ID, FAKE_SECRET
        os.environ.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret,
                          AWS_DEFAULT_REGION="us-east-1")
        boto3.client("s3").create_bucket(Bucket="shutdown")
        yield "s3://shutdown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=LONG_RUNS)
    parser.add_argument("--store", choices=("ceph", "moto"), default="ceph")
    args = parser.parse_args()
    logs = ROOT / "runs" / time.strftime("shutdown-%Y%m%d-%H%M%S")
    with _bucket_on(args.store) as bucket:
        results = []
        for result in run(bucket, logs, args.runs):
            results.append(result)
            print(f"run {result.number}: {'exit 0' if result.error is None else result.error} "
                  f"in {result.seconds:.1f} s", flush=True)
    failed = [r for r in results if r.error is not None]
    print(f"{len(results) - len(failed)} of {len(results)} runs exited 0 within {EXIT_BOUND:.0f} s "
          f"(longest {max(r.seconds for r in results):.1f} s); logs in {logs}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
