"""A job that saves into a run URL and holds its writer lease (tests/test_writer_lease.py).

``python tests/lease_job.py '<json args>'`` saves step 1 under ``url``, creates
``<handshake>/ready`` and waits for ``<handshake>/go``; then, with ``"then": "exit"``, it
exits cleanly; with ``"then": "save_until_refused"`` it saves step 2, 3, ... until a save is
refused (for ``"seconds"`` at most, 120 unless given) and writes the error to
``<handshake>/outcome``, or "never refused". ``start`` runs it from a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(args: dict) -> None:
    import torch

    from dist_resume import save_checkpoint
    from dist_resume.errors import CheckpointError

    handshake = Path(args["handshake"])
    save_checkpoint({"w": torch.zeros(2)}, args["url"], 1)
    (handshake / "ready").write_text("")
    while not (handshake / "go").exists():  # released by the test, whatever the timing
        time.sleep(0.01)
    if args["then"] == "save_until_refused":
        deadline = time.monotonic() + args.get("seconds", 120)
        step = 2
        while time.monotonic() < deadline:  # until this job's heartbeat finds the takeover
            try:
                save_checkpoint({"w": torch.zeros(2)}, args["url"], step)
            except CheckpointError as error:
                (handshake / "outcome").write_text(str(error))
                return
            step += 1
            time.sleep(0.05)
        (handshake / "outcome").write_text("never refused")


def start(url: str, handshake: Path, then: str, seconds: float = 120, **env: str) -> subprocess.Popen:
    """The job, started with ``env`` added to this process's environment, once it saved step 1."""
    handshake.mkdir()
    args = {"url": url, "handshake": str(handshake), "then": then, "seconds": seconds}
    job = subprocess.Popen([sys.executable, __file__, json.dumps(args)], env={**os.environ, **env},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (handshake / "ready").exists():
        if job.poll() is not None or time.monotonic() > deadline:
            job.kill()
            raise AssertionError(f"the job did not save (exit code {job.poll()}): {job.communicate()[0].decode()}")
        time.sleep(0.01)
    return job


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
