"""Where the peer suites come from: released source archives in a package registry, fetched
once, checked against a pinned SHA-256 and cached (never committed: other projects' code).

torch's `test/test_dataloader.py` comes from Debian's source package of PyTorch: the only
registry that serves torch's tests (PyPI has no torch sdist). Debian's archive serves the
source of trixie's 2.6.0; sid's 2.14.1 is listed but not served. torchdata's
`test/stateful_dataloader/` is in no registry (its PyPI releases are wheels without tests).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import urllib.request
from pathlib import Path
from typing import NamedTuple


class PeerSource(NamedTuple):
    url: str
    sha256: str
    member: str  # the file of the archive that is the suite


TORCH_DATALOADER = PeerSource(
    url="http://deb.debian.org/debian/pool/main/p/pytorch/pytorch_2.6.0+dfsg.orig.tar.xz",
    sha256="099a9601bc40d67656e75735c44abedb0fbe92d08817852ab7472eebb7e6ddff",
    member="pytorch-v2.6.0/test/test_dataloader.py",
)


def cache_dir() -> Path:
    return Path(os.environ.get("DIST_RESUME_PEER_CACHE", Path.home() / ".cache" / "dist-resume" / "peer"))


def fetched(source: PeerSource) -> Path:
    """The suite file of `source`, downloaded and checked on first use."""
    archive = cache_dir() / source.url.rsplit("/", 1)[1]
    suite = cache_dir() / source.sha256[:16] / Path(source.member).name
    if suite.exists():
        return suite
    if not archive.exists() or _sha256(archive) != source.sha256:
        _download(source.url, archive)
        digest = _sha256(archive)
        if digest != source.sha256:
            archive.unlink()
            raise RuntimeError(f"{source.url} has SHA-256 {digest}, expected {source.sha256}: not the pinned release")
    with tarfile.open(archive, "r:xz") as tar:
        try:
            member = tar.extractfile(source.member)
        except KeyError:
            member = None
        if member is None:
            raise RuntimeError(f"{archive} has no file {source.member}")
        text = member.read()
    suite.parent.mkdir(parents=True, exist_ok=True)
    partial = suite.with_suffix(f".{os.getpid()}.partial")  # processes fetching at once never share one
    partial.write_bytes(text)
    partial.replace(suite)
    return suite


def _download(url: str, path: Path, attempts: int = 3) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    print(f"fetching {url} (once; cached in {path.parent})", flush=True)
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(url, timeout=120) as response, open(partial, "wb") as out:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
            break
        except OSError as error:
            if attempt == attempts:
                raise RuntimeError(f"could not fetch the peer suite's source {url} ({attempts} attempts): {error}") from error
    partial.replace(path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
