"""``python -m dist_resume.launched SCRIPT [ARGS...]``: run SCRIPT as ``__main__`` in a process
that ends when its launcher dies (see ``end_with_launcher``; ``DIST_RESUME_END_WITH_LAUNCHER=0``
opts out). The launch scripts start every worker this way, so ``kill -9`` of torchrun ends the
job's workers too, whether the script imports dist_resume or not."""

from __future__ import annotations

import os
import runpy
import sys

from dist_resume.process_group import end_with_launcher, launcher_ending_wanted


def main() -> None:
    if launcher_ending_wanted():
        end_with_launcher()
    if len(sys.argv) < 2:
        print("usage: python -m dist_resume.launched SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
