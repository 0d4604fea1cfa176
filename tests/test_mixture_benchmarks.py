"""The mixture benchmark rows run end to end and report their targets (no timing asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_mixture_rows_report_their_targets(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", "B1M,B2M", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    figures = {figure_id: json.loads((tmp_path / f"{figure_id}.json").read_text())["figures"][figure_id]
               for figure_id in ("B1-mixture", "B2-mixture")}  # each figure's own file
    assert {check["name"] for check in figures["B2-mixture"]["checks"]} == {
        f"resume at {p}: vs fresh epoch" for p in ("0%", "50%", "99%")}
    assert {check["target"] for check in figures["B1-mixture"]["checks"]} == {">= 0.97"}
    assert len(figures["B1-mixture"]["checks"]) == 4
