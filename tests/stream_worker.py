"""One gloo rank of a ShardedStream training job for tests/test_sharded_stream_multiprocess.py.

Run by ``tests.checkpoint_worker.run(..., script=__file__)``: loads the checkpoint at
``ckpt`` (if any), takes ``steps`` batches (default: to the epoch's end), saves at step
``save_step`` if given, and writes the batches it consumed to
``out/batches-<scenario>-<rank>.json``.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dist_resume import (  # noqa: E402
    ResumableDataLoader,
    load_checkpoint,
    save_checkpoint,
    shut_down_distributed,  # noqa: E402
)
from tests.stream_jobs import make_stream  # noqa: E402


def run_rank(scenario: str, args: dict[str, Any], make_loader: Callable[[dict[str, Any]], ResumableDataLoader]) -> None:
    """One rank's job (see the module docstring) over the loader `make_loader(args)` builds
    once the process group is up."""
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    loader = make_loader(args)
    load_checkpoint({"loader": loader}, args["ckpt"])
    batches = [batch.tolist() for batch in itertools.islice(loader, args.get("steps"))]
    if "save_step" in args:
        save_checkpoint({"loader": loader}, args["ckpt"], step=args["save_step"])
    Path(args["out"], f"batches-{scenario}-{rank}.json").write_text(json.dumps({"batches": batches,
                                                                               "len": len(loader)}))
    shut_down_distributed()


def _stream_loader(args: dict[str, Any]) -> ResumableDataLoader:
    return ResumableDataLoader(make_stream(args["urls"]), batch_size=args["batch_size"],
                               num_workers=args["num_workers"])


if __name__ == "__main__":
    run_rank(sys.argv[1], json.loads(sys.argv[2]), _stream_loader)
