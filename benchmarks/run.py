"""Entry point: `python -m benchmarks.run [--quick] [--only B1,B3] [--out DIR]`.

Runs the figures, then writes each figure's DIR/<id>.json, .md and .png, and, for a run of
every figure, DIR/latest.json and DIR/latest.md. DIR defaults to benchmarks/results (tracked:
the figures docs/performance.md cites) for a full run, and to ./runs/benchmarks-quick-<time>
for a quick one, whose smaller sizes must never replace them.
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
    "B4L": "b4_load",  # load rows beside B4's plan rows: load_checkpoint at N -> M ranks
    "B5": "b5_checkpoint",
    "B5L": "b5_run_listing",  # latest step and listing of a long run on S3
    "B6": "b6_seeding",
    "B6F": "b6_floors",  # the fixed costs behind B6
    "B1M": "b1_mixture",  # mixture rows of B1 and B2
    "B2M": "b2_mixture",
    "B7": "b7_streams",
    "B7R": "b7_resume_time",  # a stream's resume: seconds to the first batch, every format, local and S3
    "B7T": "b7_tar",  # B7's rows for WebDataset tar shards, against webdataset and plain tarfile
    "B8": "b8_stream_reading",  # ShardedStream: extra reading and state bytes
    "B8M": "b8_mixture_reading",  # a Mixture of ShardedStreams: extra reading
    "B9": "b9_unordered",  # stragglers, in_order=False
    "B10": "b10_packing",  # packed token sequences: tokens/s
    "B10R": "b10_packing_resume",  # packed token sequences: first batch after a load, state bytes
    "B10M": "b10_packing_mixture",  # a Mixture of packed sources: token shares
    "B11": "b11_torchft",  # ManagedLoader under torchft vs torchft's sampler; a restarted group's first data
}
RESULTS = Path(__file__).resolve().parent / "results"


def _quick_results() -> Path:
    return Path("runs") / time.strftime("benchmarks-quick-%Y%m%d-%H%M%S")


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
    parser.add_argument("--out", type=Path, help=f"output directory (default: {RESULTS} for a full run, "
                        "./runs/benchmarks-quick-<time> for --quick)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = _quick_results() if args.quick else RESULTS
    elif args.quick and args.out.resolve() == RESULTS:
        parser.error(f"--quick does not write {RESULTS}: it holds full runs (docs/performance.md cites them); "
                     "leave out --out to write ./runs/benchmarks-quick-<time>")
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
    # Each figure's own files hold its latest run; latest.* only a run of every figure, so
    # that a run of a few figures never replaces the others' figures with nothing.
    if set(chosen) == set(FIGURES):
        report.write_json(results, meta, args.out / "latest.json")
        (args.out / "latest.md").write_text(report.markdown(results, meta))
    for result in results:
        report.write_json([result], meta, args.out / f"{result.id}.json")
        (args.out / f"{result.id}.md").write_text(report.markdown([result], meta))
        report.plot(result, args.out / f"{result.id}.png")
    print(report.markdown(results, meta))
    print(f"results written to {args.out}", flush=True)


if __name__ == "__main__":
    main()
