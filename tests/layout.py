"""Where a committed step's files are, for tests that damage or inspect them."""

from __future__ import annotations

import json
from pathlib import Path

from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name


def committed_dir(run: Path, step: int) -> Path:
    """The directory holding the files that the commit of ``step`` under ``run`` names."""
    directory = run / step_dir_name(step)
    return directory / json.loads((directory / MARKER).read_text())["attempt"]
