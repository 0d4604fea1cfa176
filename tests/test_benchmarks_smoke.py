"""The benchmark harness runs end to end and writes its report (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quick_run_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    """`python -m benchmarks.run --quick --only B3,B4` writes each figure's JSON (rows and
    checks), Markdown and PNG, and no latest.json: that holds only a run of every figure."""
    subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", "B3,B4", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    assert not (tmp_path / "latest.json").exists() and not (tmp_path / "latest.md").exists()
    reports = {figure_id: json.loads((tmp_path / f"{figure_id}.json").read_text())
               for figure_id in ("B3", "B4", "B4-memory")}
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["B3.json", "B4-memory.json", "B4.json"]
    for figure_id, report in reports.items():
        assert {"mode", "torch", "torchdata", "cpus"} <= set(report["meta"])
        assert set(report["figures"]) == {figure_id}
        figure = report["figures"][figure_id]
        assert {"id", "title", "unit", "rows", "checks", "notes"} <= set(figure)
        assert figure["rows"], figure_id
        for row in figure["rows"]:
            assert {"case", "series", "stats"} <= set(row)
            assert {"median", "low", "high", "reps"} <= set(row["stats"])
        assert (tmp_path / f"{figure_id}.png").stat().st_size > 0
    assert {check["name"] for check in reports["B4"]["figures"]["B4"]["checks"]} == {"4096 -> 3072 ranks, seconds"}
    for figure_id in ("B3", "B4"):
        table = (tmp_path / f"{figure_id}.md").read_text()
        assert "| id | target | measured | met |" in table and f"### {figure_id}" in table


@pytest.mark.slow
def test_the_floor_figure_times_every_way_of_fetching(tmp_path: Path) -> None:
    """`--only B6F` times each workload's fetch unseeded and by the loader, and reseeded by
    hand only for the workload that draws (augmented)."""
    subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", "B6F", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    figure = json.loads((tmp_path / "B6-floor.json").read_text())["figures"]["B6-floor"]
    measured = {(row["case"], row["series"].split(",")[1].strip() if "," in row["series"] else row["series"])
                for row in figure["rows"]}
    assert {case for case, _ in measured} == {"fixed costs", "tiny", "token-slice", "augmented"}
    assert ("augmented", "torch reseeded by hand before each sample") in measured
    assert ("tiny", "torch reseeded by hand before each sample") not in measured
    assert all(row["stats"]["median"] > 0 for row in figure["rows"])


@pytest.mark.slow
def test_the_stream_reading_figure_meets_its_stated_bound(tmp_path: Path) -> None:
    """`--only B8`: bytes read / shard bytes is 1.00 where the world size divides C (equal
    shards, JSONL and tar) and within ShardedStream's stated bound everywhere (counted, not
    timed); the state does not grow from 10 to 10,000 shards."""
    subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", "B8", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True, timeout=600)
    figures = {figure_id: json.loads((tmp_path / f"{figure_id}.json").read_text())["figures"][figure_id]
               for figure_id in ("B8", "B8-state", "B8-load")}
    assert all(check["met"] for check in figures["B8"]["checks"] + figures["B8-state"]["checks"])
    assert sum(check["name"].endswith("(divides C)") for check in figures["B8"]["checks"]) == 8  # JSONL and tar
