"""One gloo rank of a training job over a Mixture of two streams, for
tests/test_stream_mixture_multiprocess.py: the job of tests/stream_worker.py (see there)
over the loader tests.stream_mixture_jobs.job builds, whose run is the reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dist_resume import ResumableDataLoader  # noqa: E402
from tests.stream_mixture_jobs import GLOBAL_BATCH, make_mixture  # noqa: E402
from tests.stream_worker import run_rank  # noqa: E402


def _mixture_loader(args: dict[str, Any]) -> ResumableDataLoader:
    return ResumableDataLoader(make_mixture(args["urls"]), batch_size=GLOBAL_BATCH // dist.get_world_size(),
                               num_workers=args["num_workers"], shuffle=True, seed=3)


if __name__ == "__main__":
    run_rank(sys.argv[1], json.loads(sys.argv[2]), _mixture_loader)
