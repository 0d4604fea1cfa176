"""B9 (stragglers, in_order=False) runs end to end and reports its rows and targets (no
timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_straggler_figure_compares_the_four_loaders_on_both_kinds_of_data(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", "B9", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    figure = json.loads((tmp_path / "B9.json").read_text())["figures"]["B9"]
    assert {row["series"] for row in figure["rows"]} == {
        "ResumableDataLoader in_order=False", "ResumableDataLoader in_order=True",
        "torch DataLoader in_order=False", "torch DataLoader in_order=True"}
    assert {row["case"].split(",")[0] for row in figure["rows"]} == {"map-style", "ShardedStream (8 shards)"}
    assert [(check["name"], check["target"]) for check in figure["checks"]] == [
        (f"{kind}: ResumableDataLoader in_order=False vs {other}", target)
        for kind in ("map-style", "ShardedStream")
        for other, target in (("ResumableDataLoader in_order=True", ">= 1.3"),
                              ("torch DataLoader in_order=False", ">= 0.9"))]
    assert all(row["stats"]["median"] > 0 for row in figure["rows"])
