"""One gloo rank of a packed-stream training job for tests/test_packing_multiprocess.py.

Run by ``tests.checkpoint_worker.run(..., script=__file__)``: loads the checkpoint at
``ckpt`` (if any), takes ``steps`` batches of packed sequences (default: to the epoch's
end), saves at step ``save_step`` if given, and writes the sequences it consumed to
``out/batches-<scenario>-<rank>.json``.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dist_resume import load_checkpoint, save_checkpoint, shut_down_distributed  # noqa: E402
from tests.packing_data import packed_loader, packed_stream  # noqa: E402

if __name__ == "__main__":
    scenario, args = sys.argv[1], json.loads(sys.argv[2])
    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    loader = packed_loader(packed_stream(args["urls"], args["mode"]), batch_size=args["batch_size"],
                           num_workers=args["num_workers"])
    load_checkpoint({"loader": loader}, args["ckpt"])
    batches = list(itertools.islice(loader, args.get("steps")))
    if "save_step" in args:
        save_checkpoint({"loader": loader}, args["ckpt"], step=args["save_step"])
    Path(args["out"], f"batches-{scenario}-{dist.get_rank()}.json").write_text(json.dumps({"batches": batches}))
    shut_down_distributed()
