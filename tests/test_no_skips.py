"""DIST_RESUME_NO_SKIPS=1 (CI) turns every skip into a failure that keeps its reason; without
it a skip stays a skip. Run in a child pytest over a small test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES = '''
import pytest

def test_runs():
    pass

def test_skips():
    pytest.skip("needs something this machine lacks")
'''
MODULE = '''
import pytest

pytest.importorskip("a_module_that_is_not_installed")
'''


def _pytest(directory: Path, name: str, no_skips: bool) -> tuple[int, str]:
    env = {key: value for key, value in os.environ.items() if key != "DIST_RESUME_NO_SKIPS"}
    if no_skips:
        env["DIST_RESUME_NO_SKIPS"] = "1"
    result = subprocess.run([sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "-q", name],
                            capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)}, cwd=directory,
                            timeout=120, check=False)
    return result.returncode, result.stdout


@pytest.mark.parametrize("no_skips", [False, True])
def test_a_skip_fails_only_where_every_case_must_run(tmp_path: Path, no_skips: bool) -> None:
    (tmp_path / "conftest.py").write_text("from tests.no_skips import pytest_make_collect_report, "
                                          "pytest_runtest_makereport  # noqa: F401\n")
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "test_module.py").write_text(MODULE)
    cases, module = _pytest(tmp_path, "test_cases.py", no_skips), _pytest(tmp_path, "test_module.py", no_skips)
    if not no_skips:
        assert (cases[0], cases[1].splitlines()[-1].split(" in ")[0]) == (0, "1 passed, 1 skipped")
        assert (module[0], module[1].splitlines()[-1].split(" in ")[0]) == (5, "1 skipped")
        return
    assert (cases[0], cases[1].splitlines()[-1].split(" in ")[0]) == (1, "1 failed, 1 passed")
    assert ("skipped, but DIST_RESUME_NO_SKIPS=1 makes a skip a failure: Skipped: needs something this machine "
            "lacks") in cases[1]
    assert (module[0], module[1].splitlines()[-1].split(" in ")[0]) == (2, "1 error")
    assert ("skipped, but DIST_RESUME_NO_SKIPS=1 makes a skip a failure: Skipped: could not import "
            "'a_module_that_is_not_installed'") in module[1]
