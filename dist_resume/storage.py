"""Checkpoint storage through fsspec: any URL, retried requests, redacted messages (G9).

Credentials and endpoints come from where the fsspec backend looks for them (for s3fs:
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, AWS config files)
or from ``storage_options``. No message produced here contains a secret: URLs lose their
user info and query string, and secret option values are masked.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import (
    FileSystem,
    FsspecReader,
    FsspecWriter,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from dist_resume.errors import StorageError

T = TypeVar("T")

_SECRET_OPTION = re.compile(r"secret|token|password|passwd|credential|signature|sas", re.I)
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][\w+.-]*://)[^/@\s]+@")
# errnos s3fs (and the OS) use for throttling, server errors and dropped connections.
_TRANSIENT_ERRNOS = {
    errno.EBUSY,
    getattr(errno, "EREMOTEIO", errno.EIO),
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ECONNREFUSED,
    errno.ETIMEDOUT,
    errno.EPIPE,
}
_THROTTLING_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                     "RequestLimitExceeded", "TooManyRequests"}
RETRY_ATTEMPTS = 5
RETRY_BASE_DELAY = 0.2  # seconds; doubles at each attempt
_SPOOL_BYTES = 64 * 2**20


def redact_url(url: str) -> str:
    """``url`` without user info (credentials) and without query string or fragment."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:  # a local path (or a Windows drive)
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _secret_values(options: dict[str, Any]) -> list[str]:
    found = []
    for name, value in options.items():
        if isinstance(value, dict):
            found += _secret_values(value)
        elif isinstance(value, str) and value and _SECRET_OPTION.search(name):
            found.append(value)
    return found


@dataclass(frozen=True)
class Location:
    """A checkpoint URL resolved to an fsspec filesystem and a path inside it."""

    fs: fsspec.AbstractFileSystem
    root: str
    url: str  # redacted: safe to print
    secrets: tuple[str, ...]

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def join(self, *names: str) -> str:
        return "/".join([self.root.rstrip("/"), *names])

    def url_of(self, path: str) -> str:
        """Printable URL of ``path`` (a path inside this location)."""
        return self.url.rstrip("/") + path[len(self.root.rstrip("/")):]

    def redact(self, text: str) -> str:
        """``text`` with secret values masked and URL credentials removed."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return _URL_USERINFO.sub(r"\g<scheme>***@", text)

    def error(self, action: str, path: str, exc: BaseException) -> StorageError:
        """A StorageError for ``action`` on ``path`` that failed with ``exc``, secrets masked."""
        if isinstance(exc, PermissionError):
            hint = "access denied, check the credentials"
        elif isinstance(exc, FileNotFoundError):
            hint = "not found"
        else:
            hint = "storage error"
        detail = self.redact(str(exc)) or type(exc).__name__
        return StorageError(
            f"cannot {action} {self.url_of(path)}: {hint} ({type(exc).__name__}: {detail})"
        )


def resolve(url: str | os.PathLike, storage_options: dict[str, Any] | None = None) -> Location:
    """Resolve a local path, ``file://``, ``s3://`` or any fsspec URL."""
    options = dict(storage_options or {})
    text = os.fspath(url)
    secrets = tuple(_secret_values(options) + [v for k in _SECRET_ENV if (v := os.environ.get(k))])
    printable = redact_url(text)
    if not text:  # fsspec reads "" as the current directory: an unset variable must not mean "here"
        raise StorageError("cannot open storage for '': the checkpoint URL is empty")
    try:
        fs, root = fsspec.core.url_to_fs(text, **options)
    except (ValueError, ImportError, TypeError) as exc:
        message = str(exc)
        for secret in secrets:
            message = message.replace(secret, "***")
        raise StorageError(f"cannot open storage for {printable}: {message}") from None
    return Location(fs=fs, root=root.rstrip("/") or root, url=printable, secrets=secrets)


def _error_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_transient(exc: BaseException) -> bool:
    """True for throttling, server-side (5xx) errors, timeouts and dropped connections."""
    for err in _error_chain(exc):
        if isinstance(err, (ConnectionError, TimeoutError)):
            return True
        if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:
            return True
        response = getattr(err, "response", None)
        if isinstance(response, dict):  # botocore ClientError
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if status >= 500 or status == 429:
                return True
            if response.get("Error", {}).get("Code") in _THROTTLING_CODES:
                return True
        if type(err).__name__ in {"ServerDisconnectedError", "ClientConnectionError",
                                  "ClientOSError", "EndpointConnectionError"}:
            return True
    return False


def retry(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn``, retrying transient errors with exponential backoff; re-raise the last."""
    for attempt in range(RETRY_ATTEMPTS):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if attempt == RETRY_ATTEMPTS - 1 or not is_transient(exc):
                raise
            time.sleep(RETRY_BASE_DELAY * 2**attempt)
    raise AssertionError("unreachable")


def write_atomic(loc: Location, path: str, data: bytes) -> None:
    """Store ``data`` at ``path`` so that readers see all of it or nothing."""
    if not loc.is_local:
        retry(loc.fs.pipe_file, path, data)  # one object PUT is atomic
        return
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class _KeepOpen:
    """DCP closes the stream it wrote to; the spool must stay open until it is uploaded."""

    def __init__(self, spool: Any) -> None:
        self._spool = spool

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spool, name)


class _RetryingFileSystem(FileSystem):
    """torch's fsspec adapter for DCP, with retries; object-store writes are spooled locally
    and uploaded whole, so a transient failure retries the upload rather than failing DCP."""

    def __init__(self, loc: Location) -> None:
        super().__init__()
        self.fs = loc.fs
        self._spool_writes = not loc.is_local

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        path = os.fspath(path)
        if "r" in mode:
            with retry(self.fs.open, path, mode) as stream:
                yield stream
        elif not self._spool_writes:
            with super().create_stream(path, mode) as stream:
                yield stream
        else:
            with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
                yield _KeepOpen(spool)
                retry(self._upload, spool, path)

    def _upload(self, spool: Any, path: str) -> None:
        spool.seek(0)
        with self.fs.open(path, "wb") as remote:
            shutil.copyfileobj(spool, remote, 16 * 2**20)

    def rename(self, path: str | os.PathLike, new_path: str | os.PathLike) -> None:
        retry(self.fs.mv, os.fspath(path), os.fspath(new_path))

    def mkdir(self, path: str | os.PathLike) -> None:
        retry(self.fs.makedirs, os.fspath(path), exist_ok=True)

    def exists(self, path: str | os.PathLike) -> bool:
        return retry(self.fs.exists, os.fspath(path))

    def rm_file(self, path: str | os.PathLike) -> None:
        retry(self.fs.rm, os.fspath(path))

    def ls(self, path: str | os.PathLike) -> list[str]:
        return retry(self.fs.ls, os.fspath(path), detail=False)


class CheckpointWriter(FsspecWriter):
    """DCP storage writer for one step directory: retried I/O, no host-wide ``os.sync()``
    on object stores (files are fsynced on local disks), never overwrites a checkpoint."""

    def __init__(self, loc: Location, path: str) -> None:
        super().__init__(path, sync_files=loc.is_local, overwrite=False)
        self.fs = _RetryingFileSystem(loc)
        self.path = path
        self._printable = loc.url_of(path)

    def storage_meta(self) -> StorageMeta:
        # DCP stores the checkpoint id in .metadata: keep credentials out of it.
        return StorageMeta(checkpoint_id=self._printable, save_id=self.save_id)


class CheckpointReader(FsspecReader):
    """DCP storage reader for one step directory whose metadata was already read safely."""

    def __init__(self, loc: Location, path: str, metadata: Metadata) -> None:
        super().__init__(path)
        self.fs = _RetryingFileSystem(loc)
        self.path = path
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata.storage_meta is None:
            self._metadata.storage_meta = StorageMeta()
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata
