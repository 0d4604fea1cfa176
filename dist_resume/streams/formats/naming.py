"""The name of an open shard file, for error messages, without secrets."""

from __future__ import annotations

from typing import Any

from dist_resume.storage import redact_url


def file_name(file: Any) -> str:
    """Where ``file`` comes from: its fsspec URL (a plain path for local files), or its
    ``name``; credentials and secret query values removed."""
    fs, path = getattr(file, "fs", None), getattr(file, "path", None)
    if fs is not None and isinstance(path, str):
        protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
        return redact_url(path if "file" in protocols else fs.unstrip_protocol(path))
    name = getattr(file, "name", None)
    return redact_url(name) if isinstance(name, str) else f"<{type(file).__name__}>"
