"""Object-store faults (G7, G9): checkpoints saved and loaded through ``FaultProxy``.

At ``rate`` (10%) every save and load must succeed through the retries and give back
exactly what was saved. With every request failing (rate 1, from the start of a save or
right after its ``.metadata`` is stored) a save must raise a ``CheckpointError``, leave no
commit marker, and the previous committed step must stay the one that loads, unchanged.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import s3fs
import torch

from dist_resume import (
    CheckpointError,
    ResumableDataLoader,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name
from tests.faults.proxy import FAILING_KINDS, FaultProxy
from tests.faults.summary import Summary
from tests.s3_server import FAKE_KEY_ID, FAKE_SECRET

# botocore's "standard" retry mode with 2 attempts (one jittered retry), under dist_resume's
# own retries (storage.RETRY_ATTEMPTS, exponential backoff) and s3fs's (SlowDown, dropped
# connections): at a 10% fault rate an operation fails about once in 10**9; at rate 1 a
# save gives up in about 10 s instead of a minute with botocore's default (legacy, 5).
BOTOCORE_CONFIG = {"retries": {"mode": "standard", "max_attempts": 2}}
DATASET_LEN = 40
BATCH = 4
KEEP = 2
# Where a save starts failing in the rate-1 trials: its first request, or once DCP has
# stored .metadata and deleted its temporary copy, when only the commit is left.
FAIL_POINTS = {"from_start": None, "before_commit": ("DELETE", "/.metadata.tmp")}


def storage_options(endpoint: str) -> dict[str, Any]:
    return {"endpoint_url": endpoint, "key": FAKE_KEY_ID, "secret": FAKE_SECRET,
            "config_kwargs": BOTOCORE_CONFIG}


def _loader(seed: int) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(DATASET_LEN)), batch_size=BATCH, shuffle=True, seed=seed)


def _state(rng: random.Random, step: int) -> dict[str, Any]:
    """A model tensor of random values and a loader stopped after a random number of batches."""
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    loader = _loader(step)
    batches = iter(loader)
    for _ in range(rng.randrange(DATASET_LEN // BATCH)):
        next(batches)
    return {"model": {"w": torch.randn(64, 8, generator=generator), "step": step}, "loader": loader}


def _verify(url: str, options: dict[str, Any], step: int, saved: dict[str, Any], summary: Summary) -> None:
    """The latest committed step is ``step`` and holds exactly ``saved``."""
    state = {"model": {"w": torch.zeros(64, 8), "step": -1}, "loader": _loader(step)}
    assert load_checkpoint(state, url, storage_options=options) == step
    assert torch.equal(state["model"]["w"], saved["model"]["w"]) and state["model"]["step"] == step
    torch.testing.assert_close(state["loader"].state_dict(), saved["loader"].state_dict(), rtol=0, atol=0)
    summary.checkpoints_verified += 1


def run(moto: str, summary: Summary, *, rounds: int, rate: float = 0.1, seed: int = 0) -> None:
    """``rounds`` saves (sync and async in turn) and loads at ``rate``, then the rate-1 trials."""
    rng = random.Random(seed)
    bucket = f"faults-{seed}-{rng.randrange(16**8):08x}"
    direct = s3fs.S3FileSystem(endpoint_url=moto, key=FAKE_KEY_ID, secret=FAKE_SECRET, skip_instance_cache=True)
    direct.mkdir(bucket)
    url = f"s3://{bucket}/run"
    with FaultProxy(moto, rate=rate, seed=seed) as proxy:
        options = storage_options(proxy.endpoint)
        saved: dict[str, Any] = {}
        for step in range(1, rounds + 1):
            saved = _state(rng, step)
            handle = save_checkpoint(saved, url, step, keep=KEEP, async_save=step % 2 == 0,
                                     storage_options=options)
            if handle is not None:
                assert handle.result() == step
            _verify(url, options, step, saved, summary)
            summary.trials["object_store"] += 1
        summary.add_faults("s3", proxy.faults)

    for name, point in FAIL_POINTS.items():
        step = rounds + 1
        with FaultProxy(moto, kinds=FAILING_KINDS, seed=seed) as proxy:
            options = storage_options(proxy.endpoint)
            if point is None:
                proxy.rate = 1.0
            else:
                proxy.fail_after(*point)
            with pytest.raises(CheckpointError, match=rf"^(cannot [\w ]+|saving step {step} at) {url}"):
                save_checkpoint(_state(rng, step), url, step, storage_options=options)
            summary.errors_as_expected += 1
            if point is None:
                with pytest.raises(CheckpointError, match=rf"^cannot list checkpoints at {url}: storage error"):
                    load_checkpoint(_state(rng, step), url, storage_options=options)
                summary.errors_as_expected += 1
            summary.add_faults("s3", proxy.faults)
        assert not direct.exists(f"{bucket}/run/{step_dir_name(step)}/{MARKER}"), f"{name}: step {step} committed"
        assert [info.step for info in list_checkpoints(url, storage_options(moto))][-1] == rounds
        _verify(url, storage_options(moto), rounds, saved, summary)
        summary.trials[f"object_store_rate1_{name}"] += 1
