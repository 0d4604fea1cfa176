"""Where a committed step's files are, for tests that damage or inspect them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dist_resume.checkpoint.load import load_checkpoint
from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name


def committed_dir(run: Path, step: int) -> Path:
    """The directory holding the files that the commit of ``step`` under ``run`` names."""
    directory = run / step_dir_name(step)
    return directory / json.loads((directory / MARKER).read_text())["attempt"]


def forget_digests(step_dir: Path, *names: str) -> None:
    """The commit marker of the step whose files are in ``step_dir`` (`committed_dir`) without
    the digests it records of them (all, or those ``names``), as markers were written before
    they recorded any: a test that crafts a file then checks what its structure alone refuses."""
    marker = step_dir.parent / MARKER
    fields = json.loads(marker.read_text())
    digests = fields.pop("digests", {})
    kept = {name: value for name, value in digests.items() if names and name not in names}
    marker.write_text(json.dumps({**fields, "digests": kept} if kept else fields))


def weights(value: float) -> dict:
    """A small state dict whose one tensor says which save it is."""
    return {"weights": torch.full((4,), value)}


def load_weights(url: str | Path) -> tuple[int | None, float]:
    """The step `load_checkpoint` takes at ``url`` and the value its `weights` state holds."""
    state = weights(-1.0)
    step = load_checkpoint(state, str(url))
    return step, float(state["weights"][0])
