"""Checkpoint operations on an object store through fsspec (S3 and S3-compatible stores,
and any other fsspec backend): exclusive creation by a conditional PUT where the backend
offers one, literal prefix listings, deletion key by key."""

from __future__ import annotations

import posixpath
from typing import Any

from dist_resume.errors import StorageError
from dist_resume.storage.retries import S3_PROTOCOLS
from dist_resume.storage.store import DIRECTORY, FILE, OTHER, CheckpointStore, Entry


def _kind(info: dict) -> str:
    kind = info.get("type")
    return DIRECTORY if kind == "directory" else FILE if kind == "file" else OTHER


class ObjectStore(CheckpointStore):
    @property
    def _s3(self) -> bool:
        protocol = self.loc.fs.protocol
        return (protocol if isinstance(protocol, str) else protocol[0]) in S3_PROTOCOLS

    def kind(self, path: str, follow_links: bool = False) -> str | None:
        self.loc.fs.invalidate_cache()  # other processes write here: never trust a cached listing
        info = self.call_unless_missing("read", path, None, self.loc.fs.info, path)
        return None if info is None else _kind(info)

    def entries(self, path: str) -> list[Entry]:
        self.loc.fs.invalidate_cache()
        listing = self.call_unless_missing("list checkpoints at", path, [], self.loc.fs.ls, path, detail=True)
        prefix = path.rstrip("/") + "/"
        return [Entry(info["name"].rstrip("/")[len(prefix):], _kind(info)) for info in listing
                if info["name"].rstrip("/").startswith(prefix)]

    def exists(self, path: str) -> bool:
        return self.kind(path) == FILE

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """On S3 a PUT with ``If-None-Match: *``; elsewhere (and on stores that ignore that
        header) a check before and a read-back after, which narrows but cannot close the
        window in which two writers both believe they created ``path``. A lost response
        retried into "precondition failed" is told apart by reading the object back."""
        fs = self.loc.fs
        if self._s3:
            try:
                self.call("commit", path, fs.pipe_file, path, data, mode="create")
            except StorageError:
                if not self.exists(path):
                    raise
        elif self.exists(path):
            return False
        else:
            self.call("commit", path, fs.pipe_file, path, data)
        fs.invalidate_cache(posixpath.dirname(path))
        return self.call("read back", path, fs.cat_file, path) == data

    def tags(self, prefix: str, delimiter: str) -> dict[str, str] | None:
        if not self._s3:
            return None
        bucket, _, key = prefix.partition("/")
        base = self.loc.root.partition("/")[2].strip("/")
        root = f"{base}/" if base else ""  # a run at the bucket's top
        request: dict[str, Any] = {"Bucket": bucket, "Prefix": key, "Delimiter": delimiter}
        found = {}
        while True:
            # no bucket: nothing to list; whoever needs the bucket says so
            page = self.call_unless_missing("list checkpoints at", prefix, None, self.loc.fs.call_s3,
                                            "list_objects_v2", **request)
            if page is None:
                return {}
            for item in page.get("Contents", []):
                if item["Key"].startswith(root):
                    found[item["Key"][len(root):]] = item.get("ETag", "").strip('"')
            if not page.get("IsTruncated"):
                return found
            request["ContinuationToken"] = page["NextContinuationToken"]

    def overwrite(self, path: str, data: bytes) -> None:
        self.call("write", path, self.loc.fs.pipe_file, path, data)  # one PUT: whole or not at all

    def remove_tree(self, path: str) -> None:
        fs = self.loc.fs
        fs.invalidate_cache(path)
        found = self.call("list", path, fs.find, path, withdirs=True, detail=True)
        for name, info in sorted(found.items(), key=lambda item: -item[0].count("/")):
            if info.get("type") == "directory":
                if not self._s3:  # S3 has no directories to remove
                    self.call("delete", name, fs.rmdir, name)
            else:
                self.call("delete", name, fs.rm_file, name)
        if not self._s3 and self.kind(path) == DIRECTORY:
            self.call("delete", path, fs.rmdir, path)

    def remove_file(self, path: str) -> None:
        if self.exists(path):
            self.call("delete", path, self.loc.fs.rm_file, path)

    def tree_size(self, path: str) -> int:
        found = self.call("measure", path, self.loc.fs.find, path, detail=True)
        return sum(int(info.get("size") or 0) for info in found.values())

    def require_container(self, action: str) -> None:
        fs = self.loc.fs
        if fs.root_marker:  # a filesystem with a root, not buckets
            return
        bucket = self.loc.root.split("/", 1)[0]
        fs.invalidate_cache()
        # fs.exists would also say False for "access denied"
        if self.call_unless_missing(action, self.loc.root, None, fs.info, bucket) is not None:
            return
        raise StorageError(
            f"cannot {action} {self.loc.url}: bucket '{bucket}' does not exist "
            "(dist-resume never creates buckets: create it, or fix the URL)"
        )
