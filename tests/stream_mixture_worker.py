"""One gloo rank of a training job over a Mixture of two streams, for
tests/test_stream_mixture_multiprocess.py.

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
from typing import Any

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dist_resume import (  # noqa: E402
    ResumableDataLoader,
    load_checkpoint,
    save_checkpoint,
    shut_down_distributed,
)
from tests.stream_mixture_jobs import GLOBAL_BATCH, make_mixture  # noqa: E402


def _job(scenario: str, args: dict[str, Any]) -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    # the loader arguments of tests.stream_mixture_jobs.job, whose run is the reference
    loader = ResumableDataLoader(make_mixture(args["urls"]), batch_size=GLOBAL_BATCH // dist.get_world_size(),
                                 num_workers=args["num_workers"], shuffle=True, seed=3)
    load_checkpoint({"loader": loader}, args["ckpt"])
    batches = [batch.tolist() for batch in itertools.islice(loader, args.get("steps"))]
    if "save_step" in args:
        save_checkpoint({"loader": loader}, args["ckpt"], step=args["save_step"])
    Path(args["out"], f"batches-{scenario}-{rank}.json").write_text(json.dumps({"batches": batches,
                                                                               "len": len(loader)}))
    shut_down_distributed()


if __name__ == "__main__":
    _job(sys.argv[1], json.loads(sys.argv[2]))
