"""What the checkpoint layer asks of storage, one implementation per backend: literal
listings, exclusive creation of a commit marker, removal and sizes of a step's files.

Every method retries transient errors and raises :class:`StorageError` with the URL (no
secrets) for the rest; paths are absolute inside the location's filesystem.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from dist_resume.storage.location import Location
from dist_resume.storage.retries import retry

T = TypeVar("T")

FILE, DIRECTORY, LINK, OTHER = "file", "directory", "link", "other"


class Entry(NamedTuple):
    name: str
    kind: str  # FILE, DIRECTORY, LINK (local only) or OTHER (a FIFO, a device...)


class CheckpointStore(ABC):
    """Checkpoint operations on one backend, for the location ``loc``."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc

    def call(self, action: str, path: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)``, retried; other failures become one StorageError."""
        try:
            return retry(fn, *args, **kwargs)
        except Exception as exc:
            raise self.loc.error(action, path, exc) from None

    def call_unless_missing(self, action: str, path: str, missing: Any, fn: Callable[..., T], *args: Any,
                            **kwargs: Any) -> T | Any:
        """``fn(*args, **kwargs)``, retried; ``missing`` if what it reads is not there (a
        FileNotFoundError); other failures become one StorageError."""
        try:
            return retry(fn, *args, **kwargs)
        except FileNotFoundError:
            return missing
        except Exception as exc:
            raise self.loc.error(action, path, exc) from None

    @abstractmethod
    def kind(self, path: str, follow_links: bool = False) -> str | None:
        """What ``path`` is (FILE, DIRECTORY, LINK, OTHER), None if nothing is there."""

    @abstractmethod
    def entries(self, path: str) -> list[Entry]:
        """The names directly inside the directory ``path``, taken literally (no patterns);
        none if ``path`` is not a directory."""

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a file is stored at ``path``."""

    @abstractmethod
    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Store ``data`` at ``path`` unless something is there already; True if this call
        created it. Readers see all of ``data`` or nothing."""

    @abstractmethod
    def overwrite(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path``, replacing what is there; readers see the old or the
        new bytes, whole."""

    @abstractmethod
    def remove_tree(self, path: str) -> None:
        """Delete every file under ``path`` (no pattern expansion)."""

    @abstractmethod
    def remove_file(self, path: str) -> None:
        """Delete the file ``path`` if it exists."""

    @abstractmethod
    def tree_size(self, path: str) -> int:
        """Bytes stored under ``path``."""

    def tags(self, prefix: str, delimiter: str) -> dict[str, str] | None:
        """The entity tag (an MD5 of its bytes, as S3 gives it for a single PUT) of every file
        whose path starts with ``prefix``, the part after ``delimiter`` rolled up unlisted, by
        path relative to the location, from listings (a request per 1,000 files); None where
        storage offers no such tags (its files are then read)."""
        return None

    def ensure_directory(self, path: str) -> None:
        """Make the directory ``path`` if the backend has directories (object stores do not)."""

    def require_container(self, action: str) -> None:
        """Raise StorageError if the location's bucket does not exist (object stores)."""

