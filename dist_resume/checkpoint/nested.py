"""Placing a value in nested dicts and lists along a DCP object path."""

from __future__ import annotations

from typing import Any


def set_path(root: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    """Set ``value`` at ``path`` (str keys: dict entries, int keys: list slots) under
    ``root``, creating the dicts and lists on the way."""
    container: Any = root
    for key, next_key in zip(path, path[1:]):
        empty: Any = [] if isinstance(next_key, int) else {}
        if isinstance(container, list):
            container.extend([None] * (key + 1 - len(container)))
            if container[key] is None:
                container[key] = empty
        else:
            container.setdefault(key, empty)
        container = container[key]
    last = path[-1]
    if isinstance(container, list):
        container.extend([None] * (last + 1 - len(container)))
    container[last] = value
