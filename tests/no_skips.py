"""Where every case must run (CI: DIST_RESUME_NO_SKIPS=1), a skipped case or module is a
failure that keeps the skip's reason: a green run never hides a case that did not run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

NO_SKIPS = "DIST_RESUME_NO_SKIPS"


def required() -> bool:
    """Whether this run must run every case."""
    return os.environ.get(NO_SKIPS) == "1"


def _as_failure(report: Any) -> None:
    if required() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped, but {NO_SKIPS}=1 makes a skip a failure: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    _as_failure(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _as_failure(outcome.get_result())
