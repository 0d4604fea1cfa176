"""One rank of a real multi-process (gloo) job for the checkpoint tests, and its launcher.

Run by ``launch``: ``python tests/checkpoint_worker.py <scenario> <json args>`` with RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. Results go to files in ``args["out"]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from tests.script_processes import ScriptProcess

ROOT = Path(__file__).resolve().parents[1]


def launch(scenario: str, world_size: int, args: dict[str, Any], port: int,
           script: str = __file__) -> list[ScriptProcess]:
    """Start ``world_size`` ranks of ``scenario`` (of ``script``, default this file); their
    output goes to ``out/<scenario>-rank<r>.log``."""
    out = Path(args["out"])
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(world_size))
    return [ScriptProcess(script, [scenario, json.dumps(args)], dict(env, RANK=str(rank)),
                        out / f"{scenario}-rank{rank}.log")
            for rank in range(world_size)]


def run(scenario: str, world_size: int, args: dict[str, Any], port: int, timeout: float = 120,
        script: str = __file__) -> None:
    """Run ``scenario`` on ``world_size`` ranks; fail with their logs unless all exit 0."""
    procs = launch(scenario, world_size, args, port, script)
    try:
        codes = [proc.wait(timeout=timeout) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:  # no rank outlives the test, whichever one hung
            proc.kill()
            proc.wait()
        codes = None
    if codes is None or any(codes):
        logs = "\n".join((Path(args["out"]) / f"{scenario}-rank{r}.log").read_text()
                         for r in range(world_size))
        outcome = f"did not end within {timeout} s" if codes is None else f"exit codes {codes}"
        raise AssertionError(f"{scenario} {outcome}\n{logs}")


# ----------------------------------------------------------------- inside a rank

def _setup() -> tuple[int, int]:
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    return dist.get_rank(), dist.get_world_size()


def _training(seed: int, dataset_len: int) -> tuple[Any, Any, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from dist_resume.loader.resumable import ResumableDataLoader
    from tests.datasets import Indices

    torch.manual_seed(seed)
    model = DistributedDataParallel(torch.nn.Linear(8, 4))
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    # even_batches=False: no padding, so "every sample exactly once" is exact equality.
    loader = ResumableDataLoader(Indices(dataset_len), batch_size=3, shuffle=True, seed=7, even_batches=False)
    return model, optim, loader


def _train_step(model: Any, optim: Any, batch: Any) -> None:
    x = batch.float().repeat(8, 1).T.contiguous() / 100
    model(x).pow(2).sum().backward()
    optim.step()
    optim.zero_grad()


def elastic_save(args: dict[str, Any]) -> None:
    """Train a few steps; save ``step`` to the first URL, then asynchronously to the others
    while training collectives keep running; record what was consumed."""
    import torch

    from dist_resume.checkpoint.save import save_checkpoint
    from dist_resume.checkpoint.train_state import TrainState

    rank, _ = _setup()
    model, optim, loader = _training(0, args["dataset_len"])
    consumed: list[int] = []
    for _, batch in zip(range(args["train_steps"]), loader):
        _train_step(model, optim, batch)
        consumed += batch.tolist()
    app = TrainState(model, optim)
    out = Path(args["out"])
    if rank == 0:
        torch.save(app.state_dict(), out / "reference.pt")
    first, *others = args["urls"]
    save_checkpoint({"app": app, "loader": loader}, first, args["step"])
    for url in others:
        handle = save_checkpoint({"app": app, "loader": loader}, url, args["step"], async_save=True)
        _train_step(model, optim, torch.arange(3))  # DDP all-reduces while the save runs
        assert handle.result() == args["step"]
    (out / f"consumed-save-{rank}.json").write_text(json.dumps(consumed))


def elastic_load(args: dict[str, Any]) -> None:
    """Load at a new world size from every URL, check model/optimizer/loader, finish the epoch."""
    import torch
    import torch.distributed.checkpoint as dcp

    from dist_resume.checkpoint.load import load_checkpoint
    from dist_resume.checkpoint.train_state import TrainState
    from dist_resume.state.fields import ELASTIC_GUARD_KEY
    from tests.layout import committed_dir

    rank, _ = _setup()
    out = Path(args["out"])
    reference = torch.load(out / "reference.pt", weights_only=True)
    loaded_states = []
    for url in args["urls"]:
        model, optim, loader = _training(1, args["dataset_len"])
        app = TrainState(model, optim)
        if not loaded_states and args.get("plain_dcp_dir"):
            try:
                dcp.load({"app": app, "loader": loader},
                         checkpoint_id=str(committed_dir(Path(args["plain_dcp_dir"]), args["step"])))
            except BaseException as exc:  # DCP's CheckpointException is a BaseException
                (out / f"plain-dcp-error-{rank}.txt").write_text(str(exc))
        assert load_checkpoint({"app": app, "loader": loader}, url) == args["step"]
        state = app.state_dict()
        torch.testing.assert_close(state["model"], reference["model"])
        torch.testing.assert_close(state["optim"]["state"], reference["optim"]["state"])
        assert state["optim"]["param_groups"] == reference["optim"]["param_groups"]
        state = loader.state_dict()
        del state[ELASTIC_GUARD_KEY]  # only its shape matters (state.py fills it with torch.empty)
        loaded_states.append(state)
    torch.testing.assert_close(loaded_states[0], loaded_states[-1])  # local and S3 agree
    # even_batches=False: ranks may get one batch less, so no DDP steps here
    consumed = [index for batch in loader for index in batch.tolist()]
    (out / f"consumed-load-{rank}.json").write_text(json.dumps(consumed))


def killed_mid_save(args: dict[str, Any]) -> None:
    """Commit step 1, then start step 2; rank ``victim`` blocks mid-shard (the test kills it)."""
    import fsspec
    import torch

    from dist_resume.checkpoint.save import save_checkpoint
    from tests.kill_points import BlockingFileSystem

    fsspec.register_implementation("killblock", BlockingFileSystem, clobber=True)
    rank, world_size = _setup()
    torch.manual_seed(0)
    shared, mine = torch.randn(1000), torch.full((4,), float(rank))
    url = f"killblock://{args['dir']}"
    save_checkpoint({"shared": shared, "per_rank": {f"rank{rank}": mine}}, url, 1)
    BlockingFileSystem.ready = args["ready"] if rank == args["victim"] else None
    save_checkpoint({"shared": shared + 1, "per_rank": {f"rank{rank}": mine + 1}}, url, 2)


SCENARIOS = {f.__name__: f for f in (elastic_save, elastic_load, killed_mid_save)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](json.loads(sys.argv[2]))
    # As the demo does: gloo's teardown at interpreter exit aborted a rank of elastic_load
    # (SIGABRT, "terminate called without an active exception") after its checks had passed.
    import gc

    from dist_resume import shut_down_distributed

    gc.collect()  # DDP sits in a reference cycle that holds the process group
    shut_down_distributed()
