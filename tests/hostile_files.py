"""Crafting damaged and hostile checkpoints, and running a load in a fenced-off process.

The test process edits ``.metadata`` with plain pickle (it trusts what it wrote itself);
the code under test never does.

A fenced process may map MEMORY_MARGIN bytes of address space beyond what a child maps once
it has imported torch and dist_resume, measured on this machine: an absolute cap would not
admit a CUDA build of torch, whose libraries alone map several GiB.
"""

from __future__ import annotations

import functools
import io
import pickle
import resource
import subprocess
import sys
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from dist_resume.checkpoint.split_metadata import RANK_ENTRIES, SHARED
from tests.layout import forget_digests

ROOT = Path(__file__).resolve().parents[1]
# Address space a fenced process may map beyond its imports. The loads of the tests need
# 32-128 MiB of it (most: the one that starts a gloo process group); a crafted file declaring
# GiBs must not fit (tests/test_fence.py).
MEMORY_MARGIN = 2**30
HANG_LIMIT = 60  # seconds: a load that is still running then is hanging


def read_metadata(step_dir: Path) -> Any:
    return pickle.loads((step_dir / ".metadata").read_bytes())


def write_metadata(step_dir: Path, metadata: Any) -> None:
    """``metadata`` as the step's ``.metadata``; the step's split metadata is removed, so that
    every load reads this file, and the digests its commit recorded are forgotten (as for a
    step saved before either): what is tested is what the file's structure alone refuses."""
    (step_dir / ".metadata").write_bytes(pickle.dumps(metadata))
    for name in (SHARED, RANK_ENTRIES):
        (step_dir / name).unlink(missing_ok=True)
    forget_digests(step_dir)


def edit_metadata(step_dir: Path, edit: Callable[[Any], None]) -> None:
    metadata = read_metadata(step_dir)
    edit(metadata)
    write_metadata(step_dir, metadata)


def archive(data_pkl: bytes, records: dict[str, bytes] | None = None) -> bytes:
    """A torch.save archive holding ``data_pkl`` and storage ``records`` (key -> bytes)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as out:
        out.writestr("archive/data.pkl", data_pkl)
        out.writestr("archive/byteorder", "little")
        out.writestr("archive/version", "3\n")
        for key, data in (records or {}).items():
            out.writestr(f"archive/data/{key}", data)
    return buffer.getvalue()


def replace_stored(step_dir: Path, fqn: str, data: bytes) -> None:
    """Store ``data`` as the bytes of entry ``fqn``, rewriting its shard and the metadata."""
    metadata = read_metadata(step_dir)
    (index,) = [index for index in metadata.storage_data if index.fqn == fqn]
    name = metadata.storage_data[index].relative_path
    old = (step_dir / name).read_bytes()
    items = sorted((info.offset, key) for key, info in metadata.storage_data.items() if info.relative_path == name)
    rebuilt = b""
    for _, key in items:
        info = metadata.storage_data[key]
        piece = data if key == index else old[info.offset: info.offset + info.length]
        info.offset, info.length = len(rebuilt), len(piece)
        rebuilt += piece
    (step_dir / name).write_bytes(rebuilt)
    write_metadata(step_dir, metadata)


_PROBE = ("import torch, dist_resume\n"
          "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmPeak:')))")


@functools.cache
def _measured_limit(env: tuple[tuple[str, str], ...] | None) -> int:
    probe = subprocess.run([sys.executable, "-c", _PROBE], check=False, capture_output=True, text=True, cwd=ROOT,
                           env=None if env is None else dict(env), timeout=HANG_LIMIT)
    if probe.returncode != 0:
        pytest.fail(f"the address-space probe failed: {probe.stderr.strip()[-2000:]}")
    return int(probe.stdout) * 1024 + MEMORY_MARGIN


def memory_limit(env: Mapping[str, str] | None = None) -> int:
    """The address-space cap of a fenced process run with ``env`` (None: this process's
    environment): the peak a child maps by the end of ``import torch, dist_resume``, measured
    once per environment, plus MEMORY_MARGIN."""
    return _measured_limit(None if env is None else tuple(sorted(env.items())))


def run_fenced(*argv: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python argv...`` with its address space capped at ``memory_limit(env)``; a run past
    HANG_LIMIT fails the test."""
    limit = memory_limit(env)

    def fence() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        return subprocess.run([sys.executable, *argv], check=False, capture_output=True, text=True, cwd=ROOT,
                              env=None if env is None else dict(env), timeout=HANG_LIMIT, preexec_fn=fence)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv)} still running after {HANG_LIMIT} s: it hangs")


def outcome(code: str, env: Mapping[str, str] | None = None) -> str:
    """What the statement ``code`` (with ``from dist_resume import *`` done) ends with, in a
    process fenced as ``run_fenced`` does: ``ok`` or ``<error type>: <message>``."""
    script = ("import sys\nfrom dist_resume import *\nfrom dist_resume.checkpoint import read_loader_states\n"
              f"try:\n    {code}\nexcept BaseException as exc:\n"
              "    print(f'{type(exc).__name__}: {exc}')\nelse:\n    print('ok')\n")
    result = run_fenced("-c", script, env=env)
    return (result.stdout.strip().splitlines() or [result.stderr.strip()[-300:]])[-1]
