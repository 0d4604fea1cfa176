"""The benchmark harness runs end to end and writes its report (no timing is asserted)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _bench(*args: str, timeout: float, cwd: Path = ROOT, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
    """`python -m benchmarks.run *args`, which must succeed: a failure shows the run's own
    output, where its reason is (a child that failed, a count that did not match)."""
    run = subprocess.run([sys.executable, "-m", "benchmarks.run", *args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, (f"benchmarks.run {' '.join(args)} exited with {run.returncode}\n"
                                 f"--- stdout (end)\n{run.stdout[-3000:]}\n--- stderr (end)\n{run.stderr[-6000:]}")
    return run


def _tracked_results() -> dict[str, str]:
    """Every file in benchmarks/results/ (the full runs docs/performance.md cites): name -> SHA-256."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(RESULTS.iterdir())}


@pytest.mark.slow
def test_a_quick_run_leaves_the_tracked_results_alone(tmp_path: Path) -> None:
    """`python -m benchmarks.run --quick` without --out writes ./runs/benchmarks-quick-<time>/
    and says so; benchmarks/results/ keeps every file as it was (a quick run once replaced
    its full-run figures)."""
    before = _tracked_results()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = _bench("--quick", "--only", "B3", cwd=tmp_path, env=env, timeout=600)
    assert _tracked_results() == before
    written = re.search(r"^results written to (runs/benchmarks-quick-\d{8}-\d{6})$", run.stdout, re.MULTILINE)
    assert written, run.stdout[-2000:]
    assert sorted(path.name for path in (tmp_path / written.group(1)).iterdir()) == ["B3.json", "B3.md", "B3.png"]


def test_a_quick_run_refuses_to_write_the_tracked_results() -> None:
    """`--quick --out benchmarks/results` is one error before anything runs; nothing changes."""
    before = _tracked_results()
    run = subprocess.run([sys.executable, "-m", "benchmarks.run", "--quick", "--only", "B3", "--out", str(RESULTS)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and run.stdout == ""
    assert f"--quick does not write {RESULTS}: it holds full runs" in run.stderr
    assert _tracked_results() == before


@pytest.mark.slow
def test_quick_run_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    """`python -m benchmarks.run --quick --only B3,B4` writes each figure's JSON (rows and
    checks), Markdown and PNG, and no latest.json: that holds only a run of every figure."""
    _bench("--quick", "--only", "B3,B4", "--out", str(tmp_path), timeout=600)
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
    _bench("--quick", "--only", "B6F", "--out", str(tmp_path), timeout=600)
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
    _bench("--quick", "--only", "B8", "--out", str(tmp_path), timeout=600)
    figures = {figure_id: json.loads((tmp_path / f"{figure_id}.json").read_text())["figures"][figure_id]
               for figure_id in ("B8", "B8-state", "B8-load")}
    assert all(check["met"] for check in figures["B8"]["checks"] + figures["B8-state"]["checks"])
    assert sum(check["name"].endswith("(divides C)") for check in figures["B8"]["checks"]) == 8  # JSONL and tar


@pytest.mark.slow
def test_the_packing_figures_count_what_they_state(tmp_path: Path) -> None:
    """`--only B10R,B10M`: a packed stream's state is the same few bytes at 10 and 10,000
    shards and any seq_len (counted, not timed); a Mixture of packed sources weighed in tokens
    gives code its 0.3 of the real tokens within a sequence over the epoch (and in every step
    when concatenated: 'fit' is paced at its average fill), weighed in samples 0.3 of the token
    slots within a sequence."""
    _bench("--quick", "--only", "B10R,B10M", "--out", str(tmp_path), timeout=900)
    figures = {figure_id: json.loads((tmp_path / f"{figure_id}.json").read_text())["figures"][figure_id]
               for figure_id in ("B10R", "B10S", "B10M")}
    packed_states = {row["stats"]["median"] for row in figures["B10S"]["rows"] if row["series"].startswith("packed")}
    assert len(packed_states) == 1 and packed_states.pop() <= 4096
    measured: dict[str, dict[str, float]] = {}
    for row in figures["B10M"]["rows"]:
        measured.setdefault(row["case"], {})[row["series"]] = row["stats"]["median"]
    assert len(measured) == 8
    for case, values in measured.items():
        share = values["code: real tokens" if case.endswith("weigh='tokens'") else "code: token slots"]
        assert abs(share - 0.3) < 1 / values["sequences trained"], (case, values)
        if case.startswith("concat") and case.endswith("weigh='tokens'"):
            assert values["largest step gap (sequences)"] <= 1, (case, values)
    assert {row["series"] for row in figures["B10R"]["rows"]} == {"packed ShardedStream", "TokenSequences",
                                                                   "torchtitan-style buffer packing"}


@pytest.mark.slow
def test_the_torchft_figures_run_both_loaders_in_the_same_loop(tmp_path: Path) -> None:
    """`--only B11`: a real lighthouse and 2 replica groups time every loader at 0 and 2 workers
    side by side, with a second sampler for the run's noise, check each ManagedLoader row against
    the sampler's (median and interval), and time a restarted group's first data with each
    loader (what is timed is not asserted)."""
    pytest.importorskip("torchft", reason="torchft is not installed (pip install -e '.[test]' installs it)")
    _bench("--quick", "--only", "B11", "--out", str(tmp_path), timeout=900)
    figures = {figure_id: json.loads((tmp_path / f"{figure_id}.json").read_text())["figures"][figure_id]
               for figure_id in ("B11", "B11-data", "B11-first-data")}
    ours = {"dist-resume ManagedLoader", "ManagedLoader, deterministic_transforms=False"}
    samplers = {"torchft DistributedSampler", "torchft DistributedSampler, a second one"}
    cases = ("0 workers", "2 workers")
    assert {(row["case"], row["series"]) for row in figures["B11"]["rows"]} == {
        (case, series) for case in cases for series in ours | samplers}
    assert {check["name"] for check in figures["B11"]["checks"]} == {
        f"{case}: step time {series} / sampler{end}" for case in cases for series in ours
        for end in ("", ", 90% interval's upper end")} | {
        f"{case}: step time torchft DistributedSampler, a second one / sampler (the run's noise)" for case in cases}
    assert {(row["case"], row["series"]) for row in figures["B11-data"]["rows"]} == {
        (case, series) for case in cases for series in ours | samplers}
    assert {check["name"] for check in figures["B11-data"]["checks"]} == {
        f"{case}: {series}'s added wait for the batch / sampler's step" for case in cases for series in ours}
    assert {row["series"] for row in figures["B11-first-data"]["rows"]} == {"torchft DistributedSampler",
                                                                            "dist-resume ManagedLoader"}
    assert all(row["stats"]["median"] > 0 for figure in figures.values() for row in figure["rows"])


@pytest.mark.slow
def test_the_resume_time_figure_measures_every_format_and_store(tmp_path: Path) -> None:
    """`--only B7R`: a first batch after a load at 10% and 90% of an epoch, for JSONL,
    Parquet and tar shards on disk and on moto, with the counts kept, counted, given and by
    a plain replay; a cold S3 JSONL epoch against the plain reader (no timing asserted:
    each child checks its own item count, and every case must have run)."""
    _bench("--quick", "--only", "B7R", "--out", str(tmp_path), timeout=1200)
    figures = {figure_id: json.loads((tmp_path / f"{figure_id}.json").read_text())["figures"][figure_id]
               for figure_id in ("B7R", "B7R-epoch")}
    cases = {(row["case"], row["series"]) for row in figures["B7R"]["rows"]}
    series = ("counts kept (default)", "counts_cache=None: counted", "lengths= given",
              "plain IterableDataset: replay to the position")
    assert cases == {(f"{source}, {fmt}, at {at}", name) for source in ("local", "s3 (moto)")
                     for fmt in ("jsonl", "parquet", "tar") for at in ("10%", "90%") for name in series}
    assert len(figures["B7R"]["checks"]) == 12
    epoch = {row["series"] for row in figures["B7R-epoch"]["rows"]}
    assert epoch == {"ShardedStream, counts kept", "ShardedStream, counts_cache=None", "plain IterableDataset"}
    assert len(figures["B7R-epoch"]["checks"]) == 1
