"""S3 servers on loopback for tests: moto (an emulator that can inject faults), as s3fs's own
suite runs one, and Ceph's RADOS Gateway (a real object store, tests/ceph_server.py).

``s3_store`` runs a test on both; ``s3_bucket`` on moto only (fault injection, moto's API).
tests/conftest.py makes these fixtures available to every test module.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import s3fs

FAKE_KEY_ID = "dist-resume-test-key"
FAKE_SECRET = "dist-resume-test-secret-value"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 while the context lasts; yields its URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """URL of a moto S3 server on 127.0.0.1, for the whole session."""
    with moto_server() as url:
        yield url


def _fresh_bucket(monkeypatch: pytest.MonkeyPatch, endpoint: str, key_id: str, secret: str) -> str:
    """A new bucket, with endpoint and credentials in the environment only (as a real job
    gets them); returns ``s3://<bucket>``."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(bucket)
    return f"s3://{bucket}"


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on moto, endpoint and fake credentials in the environment;
    returns ``s3://<bucket>``."""
    return _fresh_bucket(monkeypatch, s3_endpoint, FAKE_KEY_ID, FAKE_SECRET)


@pytest.fixture(params=["moto", "ceph"])
def s3_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on moto, then on Ceph RGW, endpoint and credentials in the environment
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``); returns
    ``s3://<bucket>``. Each server starts on first use and serves the whole session."""
    return fresh_store(request, monkeypatch, request.param)


def fresh_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, server: str) -> str:
    """What ``s3_store`` gives, on ``server`` ("moto" or "ceph"), for fixtures of their own."""
    if server == "moto":
        return _fresh_bucket(monkeypatch, request.getfixturevalue("s3_endpoint"), FAKE_KEY_ID, FAKE_SECRET)
    rgw = request.getfixturevalue("ceph_endpoint")
    return _fresh_bucket(monkeypatch, rgw.url, rgw.key_id, rgw.secret)
