"""What identifies a `ShardedStream`'s reader in a saved stream state."""

from __future__ import annotations

import zlib
from typing import Any

from dist_resume.arguments import INT64_LIMIT


def reader_digest(reader: Any) -> int:
    """Identifies `reader`: its `digest` attribute if it has an int one, else its
    qualified name (a function's, or its class's)."""
    own = getattr(reader, "digest", None)
    if isinstance(own, int) and not isinstance(own, bool):
        return own % INT64_LIMIT
    kind = reader if hasattr(reader, "__qualname__") else type(reader)
    return zlib.crc32(f"{kind.__module__}.{kind.__qualname__}".encode())
