"""pytest plugin: installs the shim before the peer suite is imported, and deselects the
cases listed in `EXCLUDED` (each with the reason it cannot apply to ResumableDataLoader)."""

from __future__ import annotations

from typing import Any

from .shim import install

# Substring of a test id -> why that case does not apply.
EXCLUDED: dict[str, str] = {}


def pytest_configure(config: Any) -> None:
    install()


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    kept, dropped = [], []
    for item in items:
        reason = next((why for key, why in EXCLUDED.items() if key in item.nodeid), None)
        (dropped if reason else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
