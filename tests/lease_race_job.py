"""One of several jobs that start saving into the same run at the same instant
(tests/test_lease_races.py).

``python tests/lease_race_job.py '<json args>'``: for each round ``{"url": ..., "dir": ...}``
in ``args["rounds"]``, waits for ``<dir>/go``, saves step ``args["index"] + 1`` under ``url``,
writes ``{"pid": ..., "outcome": "saved" or the error}`` to ``<dir>/outcome-<index>``, then
waits for ``<dir>/done`` and ends as a job does (its leases released) before the next round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _wait_for(path: Path) -> None:
    while not path.exists():  # released by the test, whatever the timing
        time.sleep(0.001)


def main(args: dict) -> None:
    import torch

    from dist_resume import save_checkpoint
    from dist_resume.checkpoint.lease import release_all
    from dist_resume.errors import CheckpointError

    index = args["index"]
    for race in args["rounds"]:
        folder = Path(race["dir"])
        _wait_for(folder / "go")
        try:
            save_checkpoint({"w": torch.full((2,), float(index))}, race["url"], index + 1)
            outcome = "saved"
        except CheckpointError as error:
            outcome = str(error)
        written = folder / f"outcome-{index}.writing"
        written.write_text(json.dumps({"pid": os.getpid(), "outcome": outcome}))
        written.rename(folder / f"outcome-{index}")
        _wait_for(folder / "done")
        release_all()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
