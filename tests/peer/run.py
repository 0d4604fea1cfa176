"""Run a fetched copy of torch's `test/test_dataloader.py` or torchdata's
`test/stateful_dataloader/` with their loaders replaced by `ResumableDataLoader`.

    python -m tests.peer.run DIR_OR_FILE [pytest args...]

The suites are other projects' code, never in this repository: `tests/test_peer_suites.py`
runs torch's, fetched from Debian's archive (`sources.py`); torchdata's is in no registry, so
fetch it yourself (it needs `parameterized`). Prints pytest's pass/fail counts and the
excluded cases with reasons.
"""

from __future__ import annotations

import os
import sys

import pytest

from .plugin import EXCLUDED, EXPECTED_FAILURE


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    target, *extra = argv
    print("excluded cases:")
    for key, why in EXCLUDED.items():
        print(f"  {key}: {why}")
    print(f"  any case marked unittest.expectedFailure: {EXPECTED_FAILURE}")
    root = target if os.path.isdir(target) else os.path.dirname(target)
    return pytest.main([target, "-p", "tests.peer.plugin", "--rootdir", root, "-c", "/dev/null",
                        "-p", "no:cacheprovider", "-q", "-rfE", *extra])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
