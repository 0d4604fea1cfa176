"""What binds a step's metadata files to its commit (G7, G8): the commit marker records the
SHA-256 of each as rank 0 reads it back before committing (of ``.metadata``'s pickle, of the
split metadata's shared file and of the rank-entries file's index), and every load compares
what it reads; each record of the rank-entries file carries a digest of its own in that
index. A file changed after the commit, or taken from another save, is damage, even when it
is consistent with itself.

Steps committed before markers recorded digests are checked as before (their structure only).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from dist_resume.errors import CheckpointCorruptError

DIGESTS_KEY = "digests"
METADATA_DIGEST, SHARED_DIGEST, INDEX_DIGEST = "metadata", "shared", "rank_index"
_NAMES = (METADATA_DIGEST, SHARED_DIGEST, INDEX_DIGEST)
_HEX = re.compile(r"[0-9a-f]{64}", re.ASCII)


def sha256(data: bytes | bytearray | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def record_sum(data: bytes | bytearray | memoryview) -> int:
    """The digest of one record of the rank-entries file, as the int64 its index holds."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def checked_digests(marker: dict[str, Any], where: str) -> dict[str, str]:
    """The digests a commit marker records (none for a step committed before they were)."""
    digests = marker.get(DIGESTS_KEY, {})
    if not isinstance(digests, dict) or not all(name in _NAMES and isinstance(value, str) and _HEX.fullmatch(value)
                                                for name, value in digests.items()):
        raise CheckpointCorruptError(f"{where} is damaged: its commit marker has digests {str(digests)[:120]}")
    return digests


def require_recorded(found: str, recorded: str | None, what: str, where: str) -> None:
    """Refuse ``what`` (a file of the step) whose digest ``found`` is not the ``recorded`` one."""
    if recorded is not None and found != recorded:
        raise CheckpointCorruptError(f"{where} is damaged: its {what} is not the one its commit recorded (changed, "
                                     "or taken from another save, after the commit)")
