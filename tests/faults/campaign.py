"""All fault campaigns at one size, counted in one Summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.faults import kill, local_disk, object_store
from tests.faults.summary import Summary
from tests.s3_server import moto_server


@dataclass(frozen=True)
class Size:
    object_store_rounds: int
    local_disk_trials: int
    kill_trials: int


CI = Size(object_store_rounds=4, local_disk_trials=12, kill_trials=5)  # 2 trials of each of the 6 disk kinds
# >= 50 kill trials and >= 1,000 injected object-store faults (about 3.5 per round at 10%).
LONG = Size(object_store_rounds=300, local_disk_trials=200, kill_trials=50)


def run(size: Size, root: Path, seed: int = 0) -> Summary:
    summary = Summary()
    with moto_server() as moto:
        object_store.run(moto, summary, rounds=size.object_store_rounds, seed=seed)
    local_disk.run(root / "disk", summary, trials=size.local_disk_trials, seed=seed)
    kill.run(root / "kill", summary, trials=size.kill_trials, seed=seed)
    return summary
