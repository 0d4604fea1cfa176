"""The fence of tests/hostile_files.py (issue 23): a fenced process gets the address space its
imports need plus MEMORY_MARGIN, wherever torch's libraries are large, and a crafted file's
GiBs never fit in that margin, so the hostile-checkpoint tests fail if the library allocates
what a file declares."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.hostile_files import MEMORY_MARGIN, memory_limit, outcome

RESERVED = 6 * 2**30  # more than a CUDA build maps by the end of its import (torch 2.14.1+cu130: 3.2 GiB)
DECLARED = 2**33  # bytes: what the smallest crafted declaration below would cost
ALLOCATE = f"import torch; torch.empty({DECLARED}, dtype=torch.uint8)"
REFUSED = (r"RuntimeError: \[enforce fail at alloc_cpu\.cpp:\d+\] err == 0\. DefaultCPUAllocator: can't "
           f"allocate memory: you tried to allocate {DECLARED} bytes\\. Error code 12 \\(Cannot allocate memory\\)")

# Maps RESERVED bytes at interpreter start-up and keeps them, as torch's CUDA libraries do;
# a start-up that cannot map them ends the process, as a failed library load does.
SITECUSTOMIZE = f"""import mmap
try:
    RESERVED = mmap.mmap(-1, {RESERVED}, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
except OSError as exc:
    raise SystemExit(f"cannot map the libraries: {{exc}}")
"""


def test_margin_is_below_what_a_crafted_file_declares() -> None:
    assert MEMORY_MARGIN < DECLARED


def test_fenced_process_cannot_allocate_what_a_crafted_file_declares() -> None:
    assert re.fullmatch(REFUSED, outcome(ALLOCATE))


def test_fence_admits_an_import_of_cuda_size(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    assert memory_limit(env) > RESERVED + MEMORY_MARGIN
    assert outcome(f"assert len(__import__('sitecustomize').RESERVED) == {RESERVED}", env) == "ok"
    assert re.fullmatch(REFUSED, outcome(ALLOCATE, env))
