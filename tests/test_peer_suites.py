"""torch's own DataLoader suite (`test/test_dataloader.py` of torch 2.6.0, from Debian's
source package) run with `ResumableDataLoader` in place of `DataLoader`: every case passes
but those `tests/peer/plugin.py` excludes, each for a stated reason."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from .peer.sources import TORCH_DATALOADER, fetched
from .process_tree import run_tree

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _counts(output: str) -> dict[str, int]:
    """pytest's closing tally ("2 failed, 152 passed, ... in 66.94s") as {outcome: count}."""
    tally = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    assert tally, output[-3000:]
    return {outcome: int(count) for count, outcome in re.findall(r"(\d+) (\w+)", tally[-1].split(" in ")[0])}


def test_torchs_dataloader_suite_passes_with_resumable_dataloader():
    suite = fetched(TORCH_DATALOADER)
    run = run_tree([sys.executable, "-m", "tests.peer.run", str(suite), "-W", "ignore"], timeout=1800, cwd=ROOT)
    # skipped: CUDA-only cases; deselected: the cases tests/peer/plugin.py excludes, with its reasons.
    assert _counts(run.stdout) == {"passed": 153, "skipped": 21, "deselected": 8}, run.stdout[-5000:]
    assert run.returncode == 0, run.stdout[-5000:]
    constructed = int(re.search(r"ResumableDataLoader constructed (\d+) times", run.stdout)[1])
    assert constructed == 256, "the suite did not run ResumableDataLoader everywhere it makes a DataLoader"
