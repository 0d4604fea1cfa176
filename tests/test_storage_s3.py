"""Checkpoints on S3 (moto and Ceph RGW on loopback): endpoint and credentials from the
environment or storage_options, clear errors, no secrets stored (G9)."""

from __future__ import annotations

import os
import re
import urllib.request
from collections.abc import Iterator

import pytest
import s3fs
import torch

from dist_resume.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from dist_resume.errors import StorageError


def _roundtrip(url: str, storage_options: dict | None = None) -> None:
    assert load_checkpoint({"w": torch.zeros(4)}, url, storage_options=storage_options) is None
    for step in (1, 2, 3):
        save_checkpoint({"w": torch.full((4,), float(step)), "meta": {"step": step}}, url, step,
                        keep=2, storage_options=storage_options)
    assert [i.step for i in list_checkpoints(url, storage_options)] == [2, 3]
    state = {"w": torch.zeros(4), "meta": {"step": 0}}
    assert load_checkpoint(state, url, storage_options=storage_options) == 3
    assert torch.equal(state["w"], torch.full((4,), 3.0)) and state["meta"] == {"step": 3}


def test_roundtrip_with_endpoint_and_credentials_from_environment(s3_store: str) -> None:
    _roundtrip(f"{s3_store}/run")


def test_roundtrip_with_storage_options(s3_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """G9: endpoint and keys given only in storage_options; neither key appears in any stored file."""
    options = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"], "key": os.environ["AWS_ACCESS_KEY_ID"],
               "secret": os.environ["AWS_SECRET_ACCESS_KEY"]}
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    s3fs.S3FileSystem.clear_instance_cache()
    _roundtrip(f"{s3_store}/run", options)
    stored = s3fs.S3FileSystem(**options).find(s3_store)
    blobs = b"".join(s3fs.S3FileSystem(**options).cat(stored).values())
    for secret in (options["secret"].encode(), options["key"].encode()):
        assert secret not in blobs


def test_missing_bucket_on_load(s3_bucket: str) -> None:
    url = f"{s3_bucket}-missing/run"
    bucket = url[len("s3://"):].split("/")[0]
    message = f"cannot read checkpoints at {url}: bucket '{bucket}' does not exist"
    with pytest.raises(StorageError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"w": torch.zeros(4)}, url)
    with pytest.raises(StorageError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"w": torch.zeros(4)}, url, step=1)


@pytest.fixture
def s3_auth(s3_endpoint: str) -> Iterator[None]:
    """Make the moto server check credentials (its default accepts any)."""
    def set_count(count: str) -> None:
        request = urllib.request.Request(f"{s3_endpoint}/moto-api/reset-auth", data=count.encode(),
                                         headers={"Content-Type": "text/plain"}, method="POST")
        urllib.request.urlopen(request).close()

    set_count("0")
    yield
    set_count("inf")


def test_bad_credentials(s3_bucket: str, s3_auth: None) -> None:
    options = {"key": "wrong-key-id", "secret": "wrong-secret-value"}
    url = f"{s3_bucket}/run"
    message = (f"cannot list checkpoints at {url}: access denied, check the credentials "
               "(PermissionError: The AWS Access Key Id you provided does not exist in our records.)")
    with pytest.raises(StorageError, match=f"^{re.escape(message)}$") as caught:
        load_checkpoint({"w": torch.zeros(4)}, url, storage_options=options)
    assert "wrong-secret-value" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(StorageError, match=r"^cannot prepare s3://.*/run/step_00000001: access denied"):
        save_checkpoint({"w": torch.zeros(4)}, url, 1, storage_options=options)
