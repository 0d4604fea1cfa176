"""One rank of a real 2-rank gloo job whose rank 0 dies at a chosen moment of a save's commit
(`tests/test_save_outcome.py`): ``python tests/save_outcome_worker.py <scenario> <json args>``
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (`tests.checkpoint_worker.launch`)."""

from __future__ import annotations

import json
import os
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any


def rank0_dies_at_commit(args: dict[str, Any]) -> None:
    """Commit step 1; in step 2's save rank 0 dies right ``before`` or after it creates the
    marker (as a kill -9 would); rank 1 writes what its save ended with."""
    import torch
    import torch.distributed as dist

    import dist_resume.checkpoint.save as save
    from dist_resume import save_checkpoint

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    save_checkpoint({"weights": torch.full((4,), float(rank))}, args["url"], 1)
    if rank == 0:
        committing = save.commit

        def dying(*arguments: Any, **options: Any) -> None:
            if not args["before"]:
                committing(*arguments, **options)
            os._exit(17)

        save.commit = dying
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            save_checkpoint({"weights": torch.full((4,), 10.0 + rank)}, args["url"], 2)
            ended = "returned"
        except Exception as exc:  # noqa: BLE001 - what the save said is the result
            ended = f"{type(exc).__name__}: {exc}"
    said = [str(warning.message) for warning in caught if "torch.distributed is disabled" not in str(warning.message)]
    Path(args["out"], "rank1.json").write_text(json.dumps({"ended": ended, "warnings": said}))
    os._exit(0)  # its peer is gone: no teardown of the group


if __name__ == "__main__":
    {"rank0_dies_at_commit": rank0_dies_at_commit}[sys.argv[1]](json.loads(sys.argv[2]))
