"""What a figure reports (rows, target checks, notes) and how it is written: JSON, Markdown, PNG."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .timing import Stats


@dataclass(frozen=True)
class Row:
    """One measured value: `series` (what was measured) at `case` (under which conditions)."""

    case: str
    series: str
    stats: Stats


@dataclass(frozen=True)
class Check:
    """A target of the issue and whether this run met it (None: not measured)."""

    name: str
    value: float | None
    target: str
    met: bool | None


@dataclass
class FigureResult:
    """Everything one figure (B1 ... B6) measured."""

    id: str
    title: str
    unit: str  # "s", "batches/s", "bytes"
    rows: list[Row] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    log_scale: bool = False

    def add(self, case: str, series: str, stats: Stats) -> None:
        self.rows.append(Row(case, series, stats))

    def value(self, case: str, series: str) -> Stats:
        for row in self.rows:
            if (row.case, row.series) == (case, series):
                return row.stats
        raise KeyError((case, series))

    def check(self, name: str, value: float | None, target: str, met: bool | None) -> None:
        self.checks.append(Check(name, value, target, met))


def format_value(value: float, unit: str) -> str:
    """A value in its unit, at a precision fit for noisy timings."""
    if unit == "s":
        for scale, suffix in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= scale or suffix == "µs":
                return f"{value / scale:.3g} {suffix}"
    if unit == "bytes":
        return f"{value:,.0f} B"
    return f"{value:.3g} {unit}".strip()


def write_json(results: list[FigureResult], meta: dict[str, Any], path: Path) -> None:
    figures = {result.id: asdict(result) for result in results}
    path.write_text(json.dumps({"meta": meta, "figures": figures}, indent=2) + "\n")


def _cell(stats: Stats, unit: str) -> str:
    if stats.reps == 1 or stats.low == stats.high:
        return format_value(stats.median, unit)
    return f"{format_value(stats.median, unit)} ({format_value(stats.low, unit)} – {format_value(stats.high, unit)})"


def markdown(results: list[FigureResult], meta: dict[str, Any]) -> str:
    """A summary of the targets, then one table per figure (median, min – max)."""
    lines = [f"Run: {', '.join(f'{key} {value}' for key, value in meta.items())}", ""]
    lines += ["| id | target | measured | met |", "|---|---|---|---|"]
    for result in results:
        for check in result.checks:
            measured = "—" if check.value is None else f"{check.value:.3g}"
            met = {True: "yes", False: "**no**", None: "not measured"}[check.met]
            lines.append(f"| {result.id} | {check.name} {check.target} | {measured} | {met} |")
    for result in results:
        series = list(dict.fromkeys(row.series for row in result.rows))
        cases = list(dict.fromkeys(row.case for row in result.rows))
        cells = {(row.case, row.series): _cell(row.stats, result.unit) for row in result.rows}
        lines += ["", f"### {result.id}: {result.title}", "", f"| | {' | '.join(series)} |",
                  "|---" * (len(series) + 1) + "|"]
        lines += [f"| {case} | {' | '.join(cells.get((case, name), '—') for name in series)} |" for case in cases]
        lines += [""] + [f"- {note}" for note in result.notes] if result.notes else []
    return "\n".join(lines) + "\n"


def plot(result: FigureResult, path: Path) -> None:
    """Grouped bars of the medians, whiskers from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(dict.fromkeys(row.series for row in result.rows))
    cases = list(dict.fromkeys(row.case for row in result.rows))
    width = 0.8 / max(len(series), 1)
    figure, axes = plt.subplots(figsize=(min(12.0, max(6.0, 1.5 * len(cases))), 4.0))
    for offset, name in enumerate(series):
        points = [(x, row.stats) for x, case in enumerate(cases) for row in result.rows
                  if (row.case, row.series) == (case, name)]
        xs = [x + (offset - (len(series) - 1) / 2) * width for x, _ in points]
        medians = [stats.median for _, stats in points]
        errors = [[stats.median - stats.low for _, stats in points], [stats.high - stats.median for _, stats in points]]
        axes.bar(xs, medians, width, yerr=errors, capsize=2, label=name)
    axes.set_xticks(range(len(cases)), cases, rotation=20, ha="right", fontsize=8)
    axes.set_ylabel(result.unit)
    if result.log_scale:
        axes.set_yscale("log")
    axes.set_title(f"{result.id}: {result.title}", fontsize=10)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
