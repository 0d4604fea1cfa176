"""docker-compose.yml is valid for Debian's docker-compose (no engine needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _compose(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (CI installs it: apt-get install -y docker-compose)")
    return subprocess.run([binary, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_compose_file_is_valid() -> None:
    result = _compose("config", "-q")
    assert result.returncode == 0, result.stderr


def test_compose_runs_minio_bucket_and_two_trainers() -> None:
    result = _compose("config", "--services")
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == {"minio", "create-bucket", "trainer0", "trainer1"}
    config = _compose("config").stdout
    assert "launch/multinode.sh" in config and "launch/train.py" in config
    assert "RDZV_ENDPOINT: trainer0:29400" in config
    assert "CHECKPOINT_URL: s3://checkpoints/compose-run" in config
