"""One rank of a 2-rank job whose save of step 5 loses a peer inside rank 0's commit (issue 32):
rank 0 stops at a kill point just before it creates the commit marker (``before_marker``, as it
reads the metadata files back for their digests) or just after (``after_marker``, before it
indexes the step and tells the other rank); the test kills one rank and releases rank 0 if it
lives.

Run by ``tests.checkpoint_worker.launch(..., script=__file__)``; each rank that lives writes
how its save ended ("returned" or the error it raised) and the warnings it gave to
``out/commit-outcome-<rank>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KILL_POINTS = {"before_marker": "commit_digests", "after_marker": "write_entry"}  # what commit() calls there


def main(args: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from dist_resume import save_checkpoint
    from dist_resume.checkpoint import commit
    from tests.kill_points import block_before

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    state = {"w": torch.full((2,), float(rank)), f"rank{rank}": torch.ones(3)}
    if rank == 0:
        block_before(commit, KILL_POINTS[args["point"]], args["ready"], args["release"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            handle = save_checkpoint(state, args["url"], 5, async_save=args["async_save"])
            if handle is not None:
                handle.result()
            ended = "returned"
        except Exception as exc:  # noqa: BLE001 - how the save ended is the result
            ended = f"{type(exc).__name__}: {exc}"
    said = [str(warning.message) for warning in caught]
    Path(args["out"], f"commit-outcome-{rank}.json").write_text(json.dumps({"ended": ended, "warnings": said}))
    os._exit(0)  # the group cannot be left in order: a peer is gone


if __name__ == "__main__":
    main(json.loads(sys.argv[2]))
