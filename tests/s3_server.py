"""A moto S3 server on loopback for tests, as s3fs's own suite runs one.

Use the fixtures by importing them into a test module:
``from tests.s3_server import s3_bucket, s3_endpoint  # noqa: F401``.
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


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket, with endpoint and fake credentials in the environment only (as a
    real job gets them); returns ``s3://<bucket>``."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(bucket)
    return f"s3://{bucket}"


@pytest.fixture
def s3_store(s3_bucket: str) -> str:
    """Where the Mixture tests store checkpoints: the moto bucket (the integrator may
    parametrize it over more S3 servers)."""
    return s3_bucket
