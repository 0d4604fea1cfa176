"""Entry point: `python -m benchmarks.run [--quick] [--only B1,B3] [--out DIR]`.

Runs the figures (B1 ... B7), then writes DIR/latest.json, DIR/latest.md and one PNG per
figure (DIR defaults to benchmarks/results).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
import warnings
from collections.abc import Callable
from importlib import import_module
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from . import report

FIGURES = {
    "B1": "b1_throughput",
    "B2": "b2_resume",
    "B3": "b3_state_size",
    "B4": "b4_remap",
    "B5": "b5_checkpoint",
    "B6": "b6_seeding",
    "B6F": "b6_floors",  # the fixed costs behind B6
    "B1M": "b1_mixture",  # mixture rows of B1 and B2
    "B2M": "b2_mixture",
    "B7": "b7_streams",
}
RESULTS = Path(__file__).resolve().parent / "results"


def _figure(figure_id: str) -> Callable[[bool], list[report.FigureResult]]:
    return import_module(f".{FIGURES[figure_id]}", __package__).run


def _machine() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "torchdata": version("torchdata"),
        "cpus": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "load average (1 min)": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions (< 5 min)")
    parser.add_argument("--only", default=",".join(FIGURES), help="comma-separated figure ids (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"output directory (default {RESULTS})")
    args = parser.parse_args(argv)
    chosen = [figure_id.strip().upper() for figure_id in args.only.split(",") if figure_id.strip()]
    unknown = sorted(set(chosen) - set(FIGURES))
    if unknown:
        parser.error(f"unknown figures {unknown}; choose from {', '.join(FIGURES)}")
    warnings.filterwarnings("ignore", message=".*set_vital.*")  # torchdata, at every iter()
    # Loader workers run torch on one thread; so does the main process here, so that
    # num_workers=0 and 2 do the same work per sample and intra-op threads do not fight
    # the workers for the cores.
    torch.set_num_threads(1)

    meta = {"mode": "quick" if args.quick else "full", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            **_machine()}
    results: list[report.FigureResult] = []
    start = time.perf_counter()
    for figure_id in chosen:
        began = time.perf_counter()
        results += _figure(figure_id)(args.quick)
        print(f"{figure_id} done in {time.perf_counter() - began:.0f} s", flush=True)
    meta["duration (s)"] = round(time.perf_counter() - start)
    meta["load average at the end (1 min)"] = round(os.getloadavg()[0], 2)

    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(results, meta, args.out / "latest.json")
    table = report.markdown(results, meta)
    (args.out / "latest.md").write_text(table)
    for result in results:
        report.plot(result, args.out / f"{result.id}.png")
    print(table)


if __name__ == "__main__":
    main()
