"""Storage faults on local disk (G6, G7): each trial commits steps 1 and 2, then damages the
checkpoint in one seeded way. A damaged step must be refused with its exact error; a failed
or partial newer save must be ignored, step 2 loading unchanged. A damaged step that loads
counts as a corrupted checkpoint accepted.

A bit flip anywhere in a stored record (the loader state's fields included) is caught by
the CRC-32 of its zip record, which dist_resume's loader verifies (torch.load does not); one
in the split metadata that a load reads, by the digests its commit recorded (or the file no
longer unpickles). ``.metadata`` itself is not read by such a load (read_loader_states does:
test_split_metadata_binding). Not injected: a flip inside a zip header.
"""

from __future__ import annotations

import errno
import io
import pickle
import random
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

from dist_resume import (
    CheckpointError,
    ResumableDataLoader,
    load_checkpoint,
    save_checkpoint,
)
from dist_resume.checkpoint.split_metadata import RANK_ENTRIES, SHARED
from dist_resume.checkpoint.step_dirs import MARKER, step_dir_name
from dist_resume.errors import CheckpointCorruptError
from dist_resume.state.fields import FIELDS, ResumeStateError
from dist_resume.state.rank_table import RANK_TABLE_KEY
from dist_resume.storage import redact_url
from tests.faults.summary import Summary
from tests.layout import committed_dir

KINDS = ("disk_full_midway", "truncated_shard", "deleted_metadata", "partial_step_dir", "loader_state_bitflip",
         "split_metadata_bitflip")
SHARD = "__0_0.distcp"
DATASET_LEN = 40
BATCH = 4


class DiskFullFileSystem(LocalFileSystem):
    """Local files whose writes fail with ENOSPC once ``budget`` bytes were written."""

    protocol = "diskfull"
    budget = 0

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return super()._strip_protocol(path.removeprefix("diskfull://"))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        file = super()._open(path, mode, **kwargs)
        if "w" in mode:
            write = file.write

            def limited(data: bytes) -> int:
                if len(data) > type(self).budget:
                    write(data[: type(self).budget])
                    type(self).budget = 0
                    raise OSError(errno.ENOSPC, "No space left on device")
                type(self).budget -= len(data)
                return write(data)

            file.write = limited
        return file


def _state(rng: random.Random) -> dict[str, Any]:
    loader = ResumableDataLoader(list(range(DATASET_LEN)), batch_size=BATCH, shuffle=True, seed=1)
    batches = iter(loader)
    for _ in range(1 + rng.randrange(DATASET_LEN // BATCH - 1)):
        next(batches)
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    return {"w": torch.randn(32, generator=generator), "loader": loader}


def _load(url: str) -> tuple[int | None, dict[str, Any]]:
    state = {"w": torch.zeros(32),
             "loader": ResumableDataLoader(list(range(DATASET_LEN)), batch_size=BATCH, shuffle=True, seed=1)}
    return load_checkpoint(state, url), state


def _same(loaded: dict[str, Any], saved: dict[str, Any]) -> bool:
    ours, theirs = loaded["loader"].state_dict(), saved["loader"].state_dict()
    return torch.equal(loaded["w"], saved["w"]) and torch.equal(ours["rank_0"]["progress"], theirs["rank_0"]["progress"])


PROGRESS_COLUMN = f"loader.{RANK_TABLE_KEY}.progress"  # what a load reads of the saved ranks' progress


def _progress_data_offset(step_dir: Path) -> int:
    """Byte offset in the shard of the saved rank's progress (int64 per field) in the rank
    table's column, after its header of one rank: [1, rank 0, length]."""
    metadata = pickle.loads((step_dir / ".metadata").read_bytes())
    [info] = [v for k, v in metadata.storage_data.items() if k.fqn == PROGRESS_COLUMN]
    blob = (step_dir / SHARD).read_bytes()[info.offset: info.offset + info.length]
    [record] = [r for r in zipfile.ZipFile(io.BytesIO(blob)).infolist() if r.filename.endswith("/data/0")]
    name_len, extra_len = struct.unpack("<HH", blob[record.header_offset + 26: record.header_offset + 30])
    return info.offset + record.header_offset + 30 + name_len + extra_len + 3 * 8


def trial(root: Path, kind: str, rng: random.Random, summary: Summary) -> None:
    """Commit steps 1 and 2 under ``root``, inflict ``kind``, check what loading does."""
    url = str(root)
    save_checkpoint(_state(rng), url, 1)
    saved = _state(rng)
    save_checkpoint(saved, url, 2)
    step_dir = committed_dir(root, 2)
    shard = step_dir / SHARD
    expected: tuple[type[Exception], str | tuple[str, ...]] | None = None  # None: step 2 loads unchanged
    if kind == "disk_full_midway":
        DiskFullFileSystem.budget = rng.randrange(shard.stat().st_size)
        fsspec.register_implementation("diskfull", DiskFullFileSystem, clobber=True)
        full_disk = f"diskfull://{root}"
        try:
            save_checkpoint(_state(rng), full_disk, 3)
            raise AssertionError("a save on a full disk succeeded")
        except CheckpointError as exc:
            assert re.fullmatch(
                rf"saving step 3 at {re.escape(redact_url(full_disk))} failed on rank\(s\) \[0\]: "
                rf"OSError: \[Errno {errno.ENOSPC}\] No space left on device",
                str(exc)), exc
        assert not (root / step_dir_name(3) / MARKER).exists()
        summary.errors_as_expected += 1
    elif kind == "truncated_shard":
        full = shard.stat().st_size
        size = rng.randrange(full)
        shard.write_bytes(shard.read_bytes()[:size])
        expected = (CheckpointCorruptError, f"step 2 at {url} is damaged: shard {SHARD} has {size} bytes, "
                                            f"its metadata needs {full}")
    elif kind == "deleted_metadata":
        (step_dir / ".metadata").unlink()
        expected = (CheckpointCorruptError, f"step 2 at {url} is damaged: .metadata is missing")
    elif kind == "partial_step_dir":
        partial = root / step_dir_name(3) / rng.choice(["", "attempt_0123456789abcdef0123456789abcdef"])
        partial.mkdir(parents=True)
        for name in rng.sample([SHARD, ".metadata", ".metadata.tmp", f"{MARKER}.tmp"], k=2):
            (partial / name).write_bytes(rng.randbytes(rng.randrange(1, 200)))
    elif kind == "split_metadata_bitflip":
        path = step_dir / rng.choice([SHARED, RANK_ENTRIES])
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        expected = (CheckpointError, (f"step 2 at {url} is damaged: ", f"refused to load {path}: "))
    else:
        field = rng.choice(FIELDS)
        where = _progress_data_offset(step_dir) + 8 * FIELDS.index(field) + rng.randrange(8)
        data = bytearray(shard.read_bytes())
        data[where] ^= 1 << rng.randrange(8)
        shard.write_bytes(bytes(data))
        expected = (CheckpointCorruptError, f"tensor '{PROGRESS_COLUMN}' of step 2 at {url} is damaged: "
                                            "record 'archive/data/0' fails its CRC-32 check")
    summary.faults[f"disk.{kind}"] += 1
    summary.trials["local_disk"] += 1
    try:
        step, loaded = _load(url)
    except (CheckpointError, ResumeStateError) as exc:
        assert expected is not None, f"{kind}: step 2 should load, got {exc!r}"
        error, message = expected
        assert isinstance(exc, error) and str(exc).startswith(message), f"{kind}: {exc!r}"
        summary.errors_as_expected += 1
        return
    if expected is not None or step != 2 or not _same(loaded, saved):
        summary.corrupted_accepted += 1
        return
    summary.checkpoints_verified += 1


def run(root: Path, summary: Summary, *, trials: int, seed: int = 0) -> None:
    """``trials`` trials, cycling through every kind, each in its own directory."""
    rng = random.Random(seed)
    for number in range(trials):
        trial(root / f"trial{number}", KINDS[number % len(KINDS)], rng, summary)
