"""Bad input through load_checkpoint (G6, G9): another seed or dataset, hand-edited loader
states with impossible counts, malformed URLs. Each has its exact error message.

The loader-level messages for edited states are in tests/test_loader.py; here they travel
through DCP and the elastic load path, as in a real resume."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from dist_resume import (
    ResumableDataLoader,
    ResumeStateError,
    StorageError,
    load_checkpoint,
    save_checkpoint,
)
from dist_resume.state.fields import FIELDS

DATASET_LEN = 20
BATCH = 4


def _loader(**kwargs: Any) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(kwargs.pop("length", DATASET_LEN))), batch_size=BATCH, **kwargs)


class _Edited:
    """A loader whose saved progress has fields overwritten, as a hand edit would."""

    def __init__(self, loader: ResumableDataLoader, fields: dict[str, int]) -> None:
        self.loader, self.fields = loader, fields

    def state_dict(self) -> dict[str, Any]:
        state = self.loader.state_dict()
        for name, value in self.fields.items():
            state["rank_0"]["progress"][FIELDS.index(name)] = value
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise AssertionError("never loaded")


def _save(tmp_path: Path, batches: int = 1, fields: dict[str, int] | None = None, **kwargs: Any) -> None:
    loader = _loader(**kwargs)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    save_checkpoint({"loader": _Edited(loader, fields or {})}, str(tmp_path), 1)


@pytest.mark.parametrize(
    "saved, message",
    [
        (dict(seed=5, shuffle=True), "loader state was saved with seed 5; this loader has seed 0"),
        (dict(length=30, shuffle=True), "loader state was saved for a dataset of 30 samples; this loader's dataset has 20"),
        (dict(shuffle=False), "loader state was saved with shuffle=False; this loader has shuffle=True"),
    ],
    ids=["seed", "dataset", "shuffle"],
)
def test_checkpoint_of_another_run_is_refused(tmp_path: Path, saved: dict, message: str) -> None:
    _save(tmp_path, **{"seed": 0, **saved})
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"loader": _loader(shuffle=True, seed=0)}, str(tmp_path))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(batches_consumed=2), "loader state of rank 0 is impossible: 2 batches hold 8 samples, the state says 4"),
        (dict(samples_consumed=-4), "loader state of rank 0 is impossible: 1 batches but -4 samples consumed"),
        (dict(batches_consumed=6, samples_consumed=24),
         "loader state of rank 0 is impossible: 6 batches consumed of an epoch that has 5"),
        (dict(world_size=2), "loader state of rank 0 is impossible: global batch 4 != 2 x 4"),
        (dict(plan_digest=1), "loader state's 'plan' does not match the digest rank 0 recorded "
                              "(entries from different saves mixed?)"),
        # Each of these two was accepted before, and lost or misread the rest of the epoch:
        (dict(epoch_finished=1), "loader state of rank 0 is impossible: its epoch is finished after 1 of 5 batches"),
        (dict(shuffle=9), "loader state of rank 0 is impossible: shuffle 9"),
    ],
    ids=["batches", "samples", "past_end", "world_size", "plan", "finished_early", "flag"],
)
def test_hand_edited_loader_state_is_refused(tmp_path: Path, fields: dict, message: str) -> None:
    _save(tmp_path, fields=fields, shuffle=True)
    with pytest.raises(ResumeStateError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"loader": _loader(shuffle=True)}, str(tmp_path))


def test_edited_epoch_is_not_detectable(tmp_path: Path) -> None:
    """A limit, stated: any epoch number is a possible state, so an edited (or bit-flipped)
    epoch resumes the same position of another epoch. Nothing in the state can tell."""
    _save(tmp_path, fields=dict(epoch=3), shuffle=True)
    loader = _loader(shuffle=True)
    assert load_checkpoint({"loader": loader}, str(tmp_path)) == 1
    assert loader.epoch == 3


@pytest.mark.parametrize(
    "url, message",
    [
        ("nosuchproto://run", "cannot open storage for nosuchproto://run: Protocol not known: nosuchproto"),
    ],
    ids=["protocol"],
)
def test_malformed_url_is_refused(url: str, message: str) -> None:
    for call in (lambda: load_checkpoint({"w": torch.zeros(1)}, url),
                 lambda: save_checkpoint({"w": torch.zeros(1)}, url, 1)):
        with pytest.raises(StorageError, match=f"^{re.escape(message)}$"):
            call()
