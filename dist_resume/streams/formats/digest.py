"""What identifies a format reader in a saved stream state."""

from __future__ import annotations

import zlib


class ConfiguredDigest:
    """Gives a reader the `digest` `ShardedStream` saves with its state: the reader's class
    and configuration (its repr), so a state read with other columns or another encoding is
    refused instead of resumed at item counts that mean other items."""

    @property
    def digest(self) -> int:
        return zlib.crc32(f"{type(self).__module__}.{self!r}".encode())
