"""The peer suite's source is the pinned release or nothing (tests/peer/sources.py)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest

from .peer.sources import PeerSource, fetched


def _archive(tmp_path: Path, text: bytes) -> tuple[str, str]:
    path = tmp_path / "release.orig.tar.xz"
    with tarfile.open(path, "w:xz") as tar:
        info = tarfile.TarInfo("release/test/test_suite.py")
        info.size = len(text)
        tar.addfile(info, io.BytesIO(text))
    return path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_pinned_archive_gives_its_suite_file_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("DIST_RESUME_PEER_CACHE", str(tmp_path / "cache"))
    url, digest = _archive(tmp_path, b"def test_one(): pass\n")
    source = PeerSource(url, digest, "release/test/test_suite.py")
    suite = fetched(source)
    assert suite.read_bytes() == b"def test_one(): pass\n"
    (tmp_path / "release.orig.tar.xz").unlink()  # no second fetch
    assert fetched(source) == suite


def test_an_archive_with_another_digest_is_refused_and_not_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("DIST_RESUME_PEER_CACHE", str(tmp_path / "cache"))
    url, digest = _archive(tmp_path, b"changed\n")
    with pytest.raises(RuntimeError, match=f"has SHA-256 {digest}, expected {'0' * 64}: not the pinned release"):
        fetched(PeerSource(url, "0" * 64, "release/test/test_suite.py"))
    assert not (tmp_path / "cache" / "release.orig.tar.xz").exists()


def test_an_archive_without_the_suite_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("DIST_RESUME_PEER_CACHE", str(tmp_path / "cache"))
    url, digest = _archive(tmp_path, b"x\n")
    with pytest.raises(RuntimeError, match="release.orig.tar.xz has no file release/test/missing.py"):
        fetched(PeerSource(url, digest, "release/test/missing.py"))


def test_an_unreachable_source_fails_saying_which(tmp_path, monkeypatch):
    monkeypatch.setenv("DIST_RESUME_PEER_CACHE", str(tmp_path / "cache"))
    missing = (tmp_path / "absent.tar.xz").as_uri()
    with pytest.raises(RuntimeError, match=f"could not fetch the peer suite's source {missing} \\(3 attempts\\)"):
        fetched(PeerSource(missing, "0" * 64, "release/test/test_suite.py"))
