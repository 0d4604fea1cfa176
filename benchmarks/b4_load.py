"""B4-load: ``load_checkpoint`` of a data loader saved by N ranks into rank 0 of a job of M
ranks, beside B4's plan rows: time and memory beyond the imports of one new rank.

The saved step is built in this process from the states B4 plans over (every old rank 0-15
batches behind the leader, half-way through an epoch of 1e10 samples), saved with
``save_checkpoint`` as one save of N ranks (its rank table included). Each measured load runs
in a fresh process: the imports and the loader are made first, then the load is timed and its
resident memory sampled every millisecond; the extra memory is the peak minus the resident
memory before the load. Side by side: the same step read the way steps saved without a rank
table are (``read_loader_states`` + ``load_state_dict``: DCP's whole ``.metadata``, and every
saved rank's entry as a DCP item).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from dist_resume import save_checkpoint

from .b4_remap import BATCH, LENGTH, stopped_job
from .report import FigureResult
from .timing import Stats

QUICK_PAIRS = [(4096, 3072)]
FULL_PAIRS = QUICK_PAIRS + [(100_000, 75_000)]
GOALS = {(4096, 3072): (0.25, 32), (100_000, 75_000): (3.0, 256)}  # seconds, MiB (issue 24)
TABLE, EVERY_ENTRY = ("load_checkpoint (rank table, split metadata)",
                      "every saved rank's entry (read_loader_states, steps saved without a table)")
EVERY_ENTRY_ONCE_BEYOND = 4096  # more saved ranks: the old path is measured once (100,000: ~100 s a load)

_CHILD = """
import json, os, sys, threading, time
from dist_resume import ResumableDataLoader, load_checkpoint, read_loader_states
url, new, how, length, batch = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
loader = ResumableDataLoader(range(length), batch_size=batch, shuffle=False, seed=0, drop_last=False,
                             even_batches=True, rank=0, world_size=new)
before = rss()
peak, done = [before], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.001)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
began = time.perf_counter()
if how == "table":
    load_checkpoint({"loader": loader}, url)
else:
    loader.load_state_dict(read_loader_states(url)[1])
took = time.perf_counter() - began
done.set()
sampler.join()
peak[0] = max(peak[0], rss())
print(json.dumps({"seconds": took, "extra_bytes": peak[0] - before}))
"""


def _measure(url: str, new: int, how: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _CHILD, url, str(new), how, str(LENGTH), str(BATCH)],
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(quick: bool) -> list[FigureResult]:
    setting = f"{LENGTH:.0e} samples, batch {BATCH} per rank"
    result = FigureResult("B4-load", f"elastic load_checkpoint into rank 0, N -> M ranks, {setting}", "s",
                          log_scale=True)
    memory = FigureResult("B4-load-memory", f"elastic load_checkpoint: resident memory beyond the imports of a "
                                            f"new rank, N -> M ranks, {setting}", "bytes", log_scale=True)
    reps = 3 if quick else 5
    with tempfile.TemporaryDirectory() as scratch:
        for old, new in QUICK_PAIRS if quick else FULL_PAIRS:
            url = str(Path(scratch) / str(old))
            save_checkpoint({"loader": stopped_job(old)}, url, 1)
            case = f"{old} -> {new}"
            ways = [("table", TABLE), ("entries", EVERY_ENTRY)]
            found: dict[str, list[dict[str, float]]] = {}
            for rep in range(reps):
                for how, _series in ways:  # interleaved: a busy machine slows both alike
                    if how == "table" or rep == 0 or old <= EVERY_ENTRY_ONCE_BEYOND:
                        found.setdefault(how, []).append(_measure(url, new, how))
            for how, series in ways:
                result.add(case, series, Stats.of([m["seconds"] for m in found[how]]))
                memory.add(case, series, Stats.of([m["extra_bytes"] for m in found[how]]))
            seconds_goal, mib_goal = GOALS[(old, new)]
            took = result.value(case, TABLE).median
            extra = memory.value(case, TABLE).median
            result.check(f"{case} ranks, seconds", took, f"<= {seconds_goal}", took <= seconds_goal)
            memory.check(f"{case} ranks, MiB", extra / 2**20, f"<= {mib_goal}", extra <= mib_goal * 2**20)
    result.notes.append("Each load in a fresh process after its imports and its loader; the step on local disk, "
                        "saved by one process as the merged states of N ranks (one save, with its rank table).")
    memory.notes.append("Peak resident memory during the load (sampled every ms) minus the resident memory "
                        "before it, in the same process.")
    return [result, memory]
