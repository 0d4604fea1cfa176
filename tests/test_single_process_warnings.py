"""Issue 32 point 4: a save or load in a single process (no process group) printed torch's
"torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to save
in a single process" every time. The library knows the intent: its own calls of DCP say
nothing, under any warnings filter (even "error"); a user's own DCP call still warns, and
every other warning still shows."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from dist_resume import ResumableDataLoader, list_checkpoints, load_checkpoint, read_loader_states, save_checkpoint


def _job(url: str) -> None:
    loader = ResumableDataLoader(list(range(8)), batch_size=2, seed=0)
    state = {"w": torch.ones(2), "loader": loader}
    save_checkpoint(state, url, 1)
    save_checkpoint(state, url, 2, async_save=True).result()
    assert load_checkpoint(state, url) == 2
    assert read_loader_states(url)[0] == 2
    assert [info.step for info in list_checkpoints(url)] == [1, 2]


@pytest.mark.parametrize("action", ["always", "error"])
def test_the_librarys_single_process_saves_and_loads_warn_of_nothing(tmp_path: Path, action: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(action)
        _job(str(tmp_path / "run"))
    assert [str(warning.message) for warning in caught] == []


def test_a_users_own_dcp_save_still_warns_and_other_warnings_still_show(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _job(str(tmp_path / "run"))
        dcp.save({"w": torch.ones(1)}, checkpoint_id=str(tmp_path / "plain"))
        warnings.warn("the user's own warning", UserWarning)
    assert [str(warning.message) for warning in caught] == [
        "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to save in a single process.",
        "the user's own warning",
    ]
