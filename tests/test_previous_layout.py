"""A checkpoint written before the package was regrouped into subpackages (issue 20) still
loads and resumes exactly: the same model values, and the same global batches after the
save at world size 1 and 3 as the two ranks that wrote it trained (G1, G3)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dist_resume import TrainState, list_checkpoints, load_checkpoint, read_loader_states, state_from_json
from tests.fixtures.make_previous_layout import HERE, loaders, model

EXPECTED = json.loads((HERE / "expected.json").read_text())


def _global_batches(world_size: int, states: dict[str, dict]) -> dict[str, list[list[int]]]:
    """Each loader's global batches after loading ``states`` on every rank of ``world_size``."""
    per_rank = 6 // world_size
    ranks = [loaders(rank, world_size, per_rank) for rank in range(world_size)]
    batches = {}
    for name in states:
        runs = []
        for job in ranks:
            job[name].load_state_dict(states[name])
            runs.append([batch.tolist() for batch in job[name]])
        assert len({len(run) for run in runs}) == 1
        batches[name] = [sum((run[step] for run in runs), []) for step in range(len(runs[0]))]
    return batches


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    # A copy: a load never writes, but the fixture must stay as the old layout wrote it.
    return str(shutil.copytree(HERE / "checkpoint", tmp_path / "checkpoint"))


def test_previous_layout_checkpoint_loads_model_and_resumes_every_loader(checkpoint: str) -> None:
    assert [info.step for info in list_checkpoints(checkpoint)] == [EXPECTED["saved_at"]]
    net, optim = model()
    job = loaders(0, 1, 6)
    step = load_checkpoint({"train": TrainState(net, optim), **job}, checkpoint)
    assert step == EXPECTED["saved_at"]
    assert [net.weight.item(), net.bias.item()] == EXPECTED["weights"]
    resumed = {name: [batch.tolist() for batch in loader] for name, loader in job.items()}
    assert resumed == EXPECTED["global_batches_after"]


def _expected(world_size: int) -> dict[str, list[list[int]]]:
    expected = json.loads(json.dumps(EXPECTED["global_batches_after"]))
    if world_size == 3:
        # 50 samples: the last global batch holds 2, padded to one per rank (even_batches)
        # with a sample of the epoch's first global batch, trained before the save.
        assert expected["plain"][-1] == [7, 6]
        expected["plain"][-1].append(19)
    return expected


def _trained_before_save(name: str) -> set[int]:
    return set(range(50)) - {sample for batch in EXPECTED["global_batches_after"][name] for sample in batch}


@pytest.mark.parametrize("world_size", [1, 3])
def test_previous_layout_loader_states_resume_at_another_world_size(checkpoint: str, world_size: int) -> None:
    states = {name: read_loader_states(checkpoint, key=name)[1] for name in EXPECTED["global_batches_after"]}
    assert _global_batches(world_size, states) == _expected(world_size)
    assert 19 in _trained_before_save("plain")


def test_previous_layout_json_states_resume_exactly() -> None:
    merged = json.loads((HERE / "loader_states.json").read_text())
    states = {name: state_from_json(json.dumps(state)) for name, state in merged.items()}
    assert all(isinstance(value, torch.Tensor) for value in states["plain"]["rank_0"].values())
    assert _global_batches(3, states) == _expected(3)
