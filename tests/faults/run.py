"""``python -m tests.faults.run [--long] [--seed N]``: run every fault campaign, print the
summary; exit 1 unless no sample was lost or repeated and no corrupted checkpoint accepted."""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

from tests.faults import campaign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--long", action="store_true", help="release size: 50 kill trials, 1,000+ S3 faults")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dist-resume-faults-") as root:
        summary = campaign.run(campaign.LONG if args.long else campaign.CI, Path(root), args.seed)
    print(summary.format())
    print(f"run time: {time.monotonic() - start:.0f} s")
    raise SystemExit(0 if summary.clean else 1)


if __name__ == "__main__":
    main()
