"""Checkpoint operations on a local (or mounted shared) disk: exclusive creation by hard
link, every write fsynced with its directory."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import uuid

from dist_resume.storage.store import DIRECTORY, FILE, LINK, OTHER, CheckpointStore, Entry


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return LINK
    if stat.S_ISDIR(mode):
        return DIRECTORY
    return FILE if stat.S_ISREG(mode) else OTHER


_PRIVATE_NAME = re.compile(r"(.+)\.[0-9a-f]{32}\.tmp")


def private_write_target(name: str) -> str | None:
    """The name that ``name`` is a local writer's private file for (a write in progress, or
    one a crash left behind), None if it is not one."""
    match = _PRIVATE_NAME.fullmatch(name)
    return match.group(1) if match else None


def _written_privately(path: str, data: bytes) -> str:
    """``data`` written and fsynced under a private name beside ``path``; that name."""
    private = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(private, "xb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    return private


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(CheckpointStore):
    def kind(self, path: str, follow_links: bool = False) -> str | None:
        try:
            return _kind((os.stat if follow_links else os.lstat)(path).st_mode)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.loc.error("read", path, exc) from None

    def entries(self, path: str) -> list[Entry]:
        listed = []
        try:
            with os.scandir(path) as found:
                for entry in found:
                    try:
                        mode = entry.stat(follow_symlinks=False).st_mode
                    except FileNotFoundError:
                        continue  # removed while listed (another writer's private file, renamed)
                    listed.append(Entry(entry.name, _kind(mode)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise self.loc.error("list", path, exc) from None
        return listed

    def exists(self, path: str) -> bool:
        return self.kind(path) is not None

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Written and fsynced under a private name, then hard-linked to ``path``: the link
        fails if ``path`` exists, so exactly one of concurrent writers creates it, whole."""
        try:
            private = _written_privately(path, data)
            try:
                os.link(private, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(private)
            _fsync_directory(os.path.dirname(path))
        except OSError as exc:
            raise self.loc.error("commit", path, exc) from None
        return True

    def ensure_directory(self, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise self.loc.error("create", path, exc) from None

    def overwrite(self, path: str, data: bytes) -> None:
        """Written and fsynced under a private name, then renamed over ``path``."""
        private = None
        try:
            private = _written_privately(path, data)
            os.replace(private, path)
        except OSError as exc:
            if private is not None:
                with contextlib.suppress(OSError):
                    os.unlink(private)
            raise self.loc.error("write", path, exc) from None

    def remove_tree(self, path: str) -> None:
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self.loc.error("delete", path, exc) from None

    def remove_file(self, path: str) -> None:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise self.loc.error("delete", path, exc) from None

    def tree_size(self, path: str) -> int:
        total = 0
        try:
            for directory, _, files in os.walk(path):
                total += sum(os.lstat(os.path.join(directory, name)).st_size for name in files)
        except OSError as exc:
            raise self.loc.error("measure", path, exc) from None
        return total
