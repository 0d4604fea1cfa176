"""docker-compose.yml is valid for Debian's docker-compose (no engine needed)."""

from __future__ import annotations

import re
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


def test_compose_runs_minio_and_two_trainers() -> None:
    """Only the trainers ever exit (no one-shot service), so ``docker-compose up
    --abort-on-container-exit`` stops when the job does and returns a trainer's status."""
    result = _compose("config", "--services")
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == {"minio", "trainer0", "trainer1"}
    config = _compose("config").stdout
    assert "launch/multinode.sh" in config and "launch/train.py" in config
    assert "RDZV_ENDPOINT: trainer0:29400" in config
    assert "CHECKPOINT_URL: s3://checkpoints/compose-run" in config


def test_images_are_pinned() -> None:
    config = _compose("config").stdout
    images = re.findall(r"^ +image: (\S+)$", config, re.MULTILINE)
    assert images == ["minio/minio:RELEASE.2024-12-18T13-15-44Z", "dist-resume-trainer:0.1.0",
                      "dist-resume-trainer:0.1.0"]
    base = re.findall(r"^FROM (\S+)", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert base == ["python:3.11.11-slim-bookworm"]


def test_documented_command_returns_the_jobs_status() -> None:
    assert "docker-compose up --build --abort-on-container-exit" in (ROOT / "docs" / "launching.md").read_text()
    assert "docker-compose up --build --abort-on-container-exit" in (ROOT / "docker-compose.yml").read_text()
