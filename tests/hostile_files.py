"""Crafting damaged and hostile checkpoints, and running a load in a fenced-off process.

The test process edits ``.metadata`` with plain pickle (it trusts what it wrote itself);
the code under test never does.
"""

from __future__ import annotations

import io
import pickle
import resource
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 2 * 2**30  # address space of a fenced process: torch and a load fit well inside
HANG_LIMIT = 60  # seconds: a load that is still running then is hanging


def read_metadata(step_dir: Path) -> Any:
    return pickle.loads((step_dir / ".metadata").read_bytes())


def write_metadata(step_dir: Path, metadata: Any) -> None:
    (step_dir / ".metadata").write_bytes(pickle.dumps(metadata))


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


def _fence() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_fenced(*argv: str) -> subprocess.CompletedProcess:
    """``python argv...`` with a bounded address space; a run past HANG_LIMIT fails the test."""
    try:
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT,
                              timeout=HANG_LIMIT, preexec_fn=_fence)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(argv)} still running after {HANG_LIMIT} s: it hangs")


def outcome(code: str) -> str:
    """What the statement ``code`` (with ``from dist_resume import *`` done) ends with, in a
    fenced process: ``ok`` or ``<error type>: <message>``."""
    script = ("import sys\nfrom dist_resume import *\nfrom dist_resume.checkpoint import read_loader_states\n"
              f"try:\n    {code}\nexcept BaseException as exc:\n"
              "    print(f'{type(exc).__name__}: {exc}')\nelse:\n    print('ok')\n")
    result = run_fenced("-c", script)
    return (result.stdout.strip().splitlines() or [result.stderr.strip()[-300:]])[-1]
