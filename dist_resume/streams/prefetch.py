"""Shard files opened ahead: while one shard of a reading stream is read, the next one's
first bytes are fetched in a background thread (the whole shard when it is small, the rest
of it opened), so a slow object store's latency (connection, metadata request, first
bytes) overlaps the reading instead of stalling it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

import fsspec

from dist_resume.storage import Location, guarded, resolve, retry
from dist_resume.streams.head_file import HeadFirstFile
from dist_resume.streams.shard_identity import check_regular

# A shard shorter than this comes whole in one request (held in memory until it is closed),
# without the metadata request that opening a file makes: at the size of small shards that
# request costs as much as the read.
HEAD_BYTES = 1 << 22
LOCAL_PROTOCOLS = (None, "file", "local")


class ShardFiles:
    """The files of `urls`, opened in that order (the order a reading stream reads its
    shards in), each with `storage_options`, transient errors retried (as the storage
    layer opens any file).

    `open(url)` hands out the next file, already open when it was prefetched, and starts
    opening the one after it in a background thread (not for local files, which have no
    latency to hide: they open when reached). Opening ahead fetches the shard's first
    `head_bytes` in one request and keeps them in memory: a shorter shard is read from
    there alone (one request in all); of a longer one the rest is read from its file,
    opened ahead as well, its first bytes after the head fetched (as far as the file's
    own buffering reads ahead). An open that failed, in the
    background or not, fails `open` of that shard (never earlier) with a `StorageError`
    naming the shard's URL and the cause, secrets removed. Use as a context manager:
    leaving it closes the file opened ahead and not handed out."""

    def __init__(self, urls: Iterable[str], storage_options: Mapping[str, Any] | None = None,
                 head_bytes: int = HEAD_BYTES) -> None:
        self._urls = iter(urls)
        self._options = guarded(dict(storage_options or {}))
        self._head_bytes = head_bytes
        self._ahead: tuple[str, Future | None] | None = None
        self._closed = False
        self._pid: int | None = None  # the process whose thread opens files (see _own_thread)
        self._thread: ThreadPoolExecutor | None = None

    def __enter__(self) -> ShardFiles:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def open(self, url: str) -> BinaryIO:
        """The next file of `urls`, which must be `url`; the caller closes it."""
        if self._closed:
            raise ValueError("ShardFiles is closed")
        self._own_thread()
        current = self._ahead or self._start()
        if current is None or current[0] != url:
            expected = "no further shard" if current is None else current[0]
            self._ahead = current
            raise ValueError(f"shard {url} opened out of the announced order (next announced: {expected})")
        self._ahead = None
        file = self._open(url, 0) if current[1] is None else current[1].result()
        self._ahead = self._start()
        return file

    def close(self) -> None:
        """Close the file opened ahead, if any: now, or when its open ends. Never waits:
        it runs in a generator's finalizer on whatever thread collects it, the object
        store's event loop among them, which an open in flight may need to end."""
        self._closed = True
        ahead, self._ahead = self._ahead, None
        if self._pid != os.getpid():  # none opened here: the parent's are not ours to close
            return
        if ahead is not None and ahead[1] is not None:
            ahead[1].add_done_callback(_close_opened)
        self._thread.shutdown(wait=False)

    def _own_thread(self) -> None:
        """This process's opening thread. One thread for all the opens (a thread per shard
        cost its start-up handshake, up to a GIL switch interval while the reader holds
        the GIL). A copy forked from another process (a loader worker) has no thread of
        its own, and the parent's file opened ahead shares its offset with the parent: it
        starts a thread and opens that shard again when it reaches it."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dist-resume prefetch")
        if self._ahead is not None:
            self._ahead = self._ahead[0], None  # opened when reached

    def _start(self) -> tuple[str, Future | None] | None:
        url = next(self._urls, None)
        if url is None:
            return None
        if fsspec.core.split_protocol(url)[0] in LOCAL_PROTOCOLS:  # no latency to hide: opened when reached
            return url, None
        return url, self._thread.submit(self._open, url, self._head_bytes)

    def _open(self, url: str, head_bytes: int) -> BinaryIO:
        """The shard at `url` open, its first `head_bytes` read into memory (0: none)."""
        location = resolve(url, self._options)  # a bad URL raises its own clear error here
        check_regular(location)
        head = _head(location, head_bytes) if head_bytes else None
        if head is not None and len(head) < head_bytes:  # the whole shard
            return HeadFirstFile(head, None, location.fs, location.root)
        file = None
        try:
            file = retry(location.fs.open, location.root, "rb")
            if head is None:
                return file
            if file.seekable():  # the bytes after the head too, into the file's buffer (or the OS page cache)
                file.seek(len(head))
                file.read(1)
            return HeadFirstFile(head, file, location.fs, location.root)
        except Exception as exc:
            if file is not None:
                file.close()
            raise location.error("read shard", location.root, exc) from None


def _close_opened(opened: Future) -> None:
    if not opened.cancelled() and opened.exception() is None:
        opened.result().close()


def _head(location: Location, size: int) -> bytes | None:
    """The first `size` bytes of the file at `location` (all of it if shorter), in one
    request; None if that read failed. S3 refuses every byte range of an empty object, and
    a read that fails for a real cause (missing, no permission) fails the plain open that
    follows, with its retries and its own error: one request more, on that path only."""
    try:
        return location.fs.cat_file(location.root, start=0, end=size)
    except Exception:
        return None
