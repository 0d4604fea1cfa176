"""What identifies a shard's bytes, learned from its storage's metadata without reading
them, and the rule that a shard is a regular file (or an object in an object store).

A local shard that is a FIFO, a device, a socket or a directory is refused before it is
opened (opening a FIFO without a writer blocks; a device such as /dev/zero never ends),
with a `StorageError` that names it and what it is.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any

from dist_resume.errors import StorageError
from dist_resume.storage import Location, retry

NO_IDENTITY = -1  # a shard whose store tells nothing that changes with its bytes but its size
# What object stores and other fsspec file systems report that changes whenever the bytes
# do: an entity tag, a version or generation, a content hash, or a modification time.
IDENTITY_FIELDS = ("ETag", "etag", "VersionId", "version_id", "generation", "md5Hash", "crc32c", "blob_id",
                   "mtime", "LastModified", "last_modified", "updated")
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def local_status(location: Location) -> os.stat_result:
    """The status of the local shard at `location` (links followed), refused unless it is
    a regular file; a missing or unreadable one is a StorageError naming it."""
    try:
        status = os.stat(location.root)
    except OSError as exc:
        raise location.error("read shard", location.root, exc) from None
    if not stat.S_ISREG(status.st_mode):
        kind = next((word for test, word in _KINDS if test(status.st_mode)), "not a regular file")
        raise _refused(location, kind)
    return status


def check_regular(location: Location) -> None:
    """Refuse a local shard that is not a regular file, before anything opens it (a shard
    in another store is checked when its identity is learned: `shard_identity`)."""
    if location.is_local:
        local_status(location)


def shard_identity(location: Location) -> int:
    """A 63-bit digest of what identifies the shard's bytes: on local disk its inode, size,
    modification and change times (a rewrite changes the change time, whatever it sets
    the modification time to); elsewhere its size and the `IDENTITY_FIELDS` its store
    reports (S3: ETag, and VersionId when versioned). `NO_IDENTITY` when the store reports
    none of them. A shard that is not a regular file or an object is refused."""
    if location.is_local:
        status = local_status(location)
        return _digest(status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)
    try:
        location.fs.invalidate_cache(location.root)  # a listing cached earlier may be stale
        info = retry(location.fs.info, location.root)
    except Exception as exc:
        raise location.error("read shard", location.root, exc) from None
    if info.get("type") != "file":
        raise _refused(location, f"a {info.get('type')!r} entry")
    fields = [(name, info[name]) for name in IDENTITY_FIELDS if info.get(name) not in (None, "")]
    return _digest(info.get("size"), *fields) if fields else NO_IDENTITY


def _digest(*parts: Any) -> int:
    text = repr(parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def _refused(location: Location, kind: str) -> StorageError:
    return StorageError(f"cannot read shard {location.url}: it is {kind}, not a regular file; a shard must be a "
                        "regular file or an object in an object store")
