"""G8: a hostile or damaged checkpoint runs no code or protocol, and costs resources in
proportion to its real size; each case ends in one clear error (issue 11, points 6 and 7).

Loads that could blow up or hang run in a separate process with a bounded address space
and a time limit (tests/hostile_files.py), so the failure before a fix is an error or a
reported hang, never a stuck test run.
"""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh

from dist_resume.checkpoint.load import read_loader_states
from dist_resume.checkpoint.save import save_checkpoint
from dist_resume.errors import CheckpointCorruptError, CheckpointError, UnsafeCheckpointError
from dist_resume.loader.resumable import ResumableDataLoader
from dist_resume.state.fields import FIELDS, RankState, encode, plan_digest
from tests.hostile_files import (
    archive,
    edit_metadata,
    outcome,
    replace_stored,
    run_fenced,
)
from tests.layout import committed_dir
from tests.s3_server import free_port


def _stored(tensor: torch.Tensor) -> bytes:
    """``tensor`` as DCP stores it (a torch.save archive)."""
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def _loader_checkpoint(url: Path, step: int = 1) -> Path:
    loader = ResumableDataLoader(list(range(20)), batch_size=3, seed=5)
    next(iter(loader))
    save_checkpoint({"loader": loader, "weights": torch.ones(4)}, str(url), step)
    return committed_dir(url, step)


class _MeshPayload:
    """Pickles as ``DeviceMesh("cpu", [0])``: a value torch's weights_only admits once
    torch.distributed.tensor is imported, and whose constructor joins a process group."""

    def __reduce__(self) -> tuple:
        return (DeviceMesh, ("cpu", [0]))


def test_stored_device_mesh_starts_no_process_group(tmp_path: Path) -> None:
    save_checkpoint({"weights": torch.ones(2), "extra": 0}, str(tmp_path), 1)
    crafted = archive(pickle.dumps(_MeshPayload(), protocol=2))
    replace_stored(committed_dir(tmp_path, 1), "extra", crafted)
    (tmp_path / "crafted.pt").write_bytes(crafted)
    script = f"""
import os, torch, torch.distributed as dist, torch.distributed.tensor
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{free_port()}", RANK="0", WORLD_SIZE="1")
from dist_resume import load_checkpoint
try:
    load_checkpoint({{"weights": torch.zeros(2), "extra": None}}, {str(tmp_path)!r})
except Exception as exc:
    print(type(exc).__name__, exc)
print("process group started:", dist.is_initialized())
torch.load({str(tmp_path / "crafted.pt")!r}, weights_only=True)  # control: the payload is live
print("control started it:", dist.is_initialized())
"""
    result = run_fenced("-c", script)
    assert result.stdout.splitlines() == [
        f"UnsafeCheckpointError refused to load stored value 'extra' of step 1 at {tmp_path}: it is not plain "
        "data (global 'torch.distributed.device_mesh.DeviceMesh' is not allowed)",
        "process group started: False",
        "control started it: True",
    ], result.stderr[-2000:]


def test_refused_global_imports_nothing(tmp_path: Path) -> None:
    save_checkpoint({"weights": torch.ones(2), "extra": 0}, str(tmp_path), 1)
    replace_stored(committed_dir(tmp_path, 1), "extra",
                   archive(b"\x80\x02ctorch._inductor.codecache\nPyCodeCache\n)R."))
    script = f"""
import sys, torch
from dist_resume import load_checkpoint
before = set(sys.modules)
try:
    load_checkpoint({{"weights": torch.zeros(2), "extra": None}}, {str(tmp_path)!r})
except Exception as exc:
    print(type(exc).__name__, exc)
print("imported:", sorted(m for m in set(sys.modules) - before if m.startswith("torch._inductor")))
"""
    result = run_fenced("-c", script)
    assert result.stdout.splitlines() == [
        f"UnsafeCheckpointError refused to load stored value 'extra' of step 1 at {tmp_path}: it is not plain "
        "data (global 'torch._inductor.codecache.PyCodeCache' is not allowed)",
        "imported: []",
    ], result.stderr[-2000:]


def test_declared_tensor_size_beyond_the_stored_bytes_is_refused(tmp_path: Path) -> None:
    step_dir = _loader_checkpoint(tmp_path)

    def inflate(metadata) -> None:  # 2**33 int64: 64 GiB from a file of a few KiB
        entry = metadata.state_dict_metadata["loader.rank_0.progress"]
        entry.size = torch.Size([2**33])
        entry.chunks[0].sizes = torch.Size([2**33])

    edit_metadata(step_dir, inflate)
    assert re.fullmatch(
        f"CheckpointCorruptError: step 1 at {re.escape(str(tmp_path))} is damaged: tensor 'loader.rank_0.progress' "
        r"declares 68719476736 bytes where \d{4} are stored", outcome(f"read_loader_states({str(tmp_path)!r})"))


def test_declared_size_beyond_its_chunks_is_refused(tmp_path: Path) -> None:
    step_dir = _loader_checkpoint(tmp_path)
    edit_metadata(step_dir, lambda m: setattr(m.state_dict_metadata["loader.rank_0.progress"], "size",
                                              torch.Size([2**40])))
    with pytest.raises(CheckpointCorruptError, match=re.escape(
            f"step 1 at {tmp_path} is damaged: tensor 'loader.rank_0.progress' declares 1099511627776 "
            f"elements, its chunks hold {len(FIELDS)}")):
        read_loader_states(str(tmp_path))


def test_chunks_sharing_stored_bytes_are_refused(tmp_path: Path) -> None:
    """Many chunks pointing at the same bytes would multiply what a small file declares."""
    step_dir = _loader_checkpoint(tmp_path)

    def alias(metadata) -> None:
        progress = [k for k in metadata.storage_data if k.fqn == "loader.rank_0.progress"][0]
        plan = [k for k in metadata.storage_data if k.fqn == "loader.plan"][0]
        metadata.storage_data[plan] = metadata.storage_data[progress]

    edit_metadata(step_dir, alias)
    with pytest.raises(CheckpointCorruptError, match=re.escape(
            f"step 1 at {tmp_path} is damaged: stored ranges of shard __0_0.distcp overlap")):
        read_loader_states(str(tmp_path))


def test_stride_zero_stored_value_is_refused(tmp_path: Path) -> None:
    """8 stored bytes viewed as 2**30 elements: a user's .tolist() would take tens of GiB."""
    save_checkpoint({"weights": torch.ones(2), "extra": 0}, str(tmp_path), 1)
    buffer = __import__("io").BytesIO()
    torch.save((torch.zeros(1, dtype=torch.int64).expand(2**30),), buffer)
    replace_stored(committed_dir(tmp_path, 1), "extra", buffer.getvalue())
    assert outcome(f"load_checkpoint({{'weights': __import__('torch').zeros(2), 'extra': None}}, {str(tmp_path)!r})") == (
        f"UnsafeCheckpointError: refused to load stored value 'extra' of step 1 at {tmp_path}: it is not plain "
        "data (a tensor of size (1073741824,) views 1073741824 elements of 1 stored ones)")


def test_planner_path_index_beyond_the_entries_is_refused(tmp_path: Path) -> None:
    step_dir = _loader_checkpoint(tmp_path)
    edit_metadata(step_dir, lambda m: m.planner_data.__setitem__("loader.rank_0.progress",
                                                                 ("loader", "rank_0", 10**12)))
    assert outcome(f"read_loader_states({str(tmp_path)!r})") == (
        f"CheckpointCorruptError: step 1 at {tmp_path} is damaged: entry 'loader.rank_0.progress' "
        "has the object path ('loader', 'rank_0', 1000000000000)")


def test_shard_name_leaving_the_step_directory_is_refused(tmp_path: Path) -> None:
    step_dir = _loader_checkpoint(tmp_path)
    (tmp_path / "outside").write_bytes(b"x" * 10**5)

    def escape(metadata) -> None:
        for info in metadata.storage_data.values():
            info.relative_path = "../outside"

    edit_metadata(step_dir, escape)
    with pytest.raises(UnsafeCheckpointError, match=re.escape(
            f"refused to load step 1 at {tmp_path}: its metadata names the file '../outside'")):
        read_loader_states(str(tmp_path))


def test_huge_world_size_in_a_loader_state_is_refused(tmp_path: Path) -> None:
    state = RankState(version=1, dataset_length=20, seed=5, shuffle=1, drop_last=0, even_batches=1, sampling=0,
                      epoch=0, world_size=10**8, rank=0, batch_size=3, global_batch=3 * 10**8,
                      batches_consumed=0, samples_consumed=0, epoch_finished=0, plan_digest=plan_digest([]))
    with pytest.raises(CheckpointError, match=re.escape(
            f"cannot save step 1: data loader state 'loader' says world size {10**8}, outside 1 to 1048576")):
        save_checkpoint({"loader": encode(state, [])}, str(tmp_path), 1)  # refused before anything is written
    save_checkpoint({"loader": encode(dataclasses.replace(state, world_size=1, global_batch=3), [])}, str(tmp_path), 1)
    replace_stored(committed_dir(tmp_path, 1), "loader.rank_0.progress", _stored(state.to_tensor()))
    result = run_fenced("-m", "dist_resume", "inspect", str(tmp_path))
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", "dist-resume: error: loader state of rank 0 is impossible: world size 100000000 "
               "above the supported 1048576\n")


def test_metadata_linked_to_dev_zero_is_refused(tmp_path: Path) -> None:
    step_dir = _loader_checkpoint(tmp_path)
    (step_dir / ".metadata").unlink()
    (step_dir / ".metadata").symlink_to("/dev/zero")
    assert outcome(f"read_loader_states({str(tmp_path)!r})") == (
        f"UnsafeCheckpointError: refused to read step 1 at {tmp_path}: .metadata links outside "
        "the checkpoint location")


def test_metadata_symlink_inside_the_location_is_read(tmp_path: Path) -> None:
    """A link that stays inside the checkpoint location is an ordinary file to us."""
    step_dir = _loader_checkpoint(tmp_path)
    (step_dir / ".metadata").rename(tmp_path / "metadata.copy")
    (step_dir / ".metadata").symlink_to(tmp_path / "metadata.copy")
    assert read_loader_states(str(tmp_path))[0] == 1


@pytest.mark.parametrize("name,command", [(".metadata", "inspect"), (".committed", "inspect"),
                                          ("step_00000001", "ls")])
def test_fifo_in_a_step_is_refused(tmp_path: Path, name: str, command: str) -> None:
    """``inspect`` reads the step's files, ``ls`` its marker and the run's index of committed steps."""
    attempt = _loader_checkpoint(tmp_path)
    directory = {".metadata": attempt, ".committed": attempt.parent, "step_00000001": tmp_path / ".commits"}[name]
    for path in directory.glob(f"{name}*"):  # an index entry's name says more than its step
        path.unlink()
    os.mkfifo(directory / name)
    result = run_fenced("-m", "dist_resume", command, str(tmp_path))
    if command == "ls":  # a FIFO in the index is not an entry: ignored, never opened
        assert (result.returncode, result.stderr) == (0, "") and result.stdout.splitlines()[1].split()[0] == "1"
        return
    refusal = f"refused to read step 1 at {tmp_path}: {name} is not a regular file"
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"dist-resume: error: {refusal}\n")


def test_declared_size_2_40_is_one_line_in_the_cli(tmp_path: Path) -> None:
    step_dir = _loader_checkpoint(tmp_path)

    def inflate(metadata) -> None:
        entry = metadata.state_dict_metadata["loader.rank_0.progress"]
        entry.size = entry.chunks[0].sizes = torch.Size([2**40])

    edit_metadata(step_dir, inflate)
    result = run_fenced("-m", "dist_resume", "inspect", str(tmp_path))
    assert (result.returncode, result.stdout) == (1, "")
    assert re.fullmatch(f"dist-resume: error: step 1 at {re.escape(str(tmp_path))} is damaged: tensor "
                        r"'loader.rank_0.progress' declares 8796093022208 bytes where \d{4} are stored\n", result.stderr)


def test_inspect_of_a_stored_device_mesh_starts_no_rendezvous(tmp_path: Path) -> None:
    """The same payload as a loader's sampler state: ``dist-resume inspect`` refuses it and
    joins no process group (the rendezvous address points at a port nobody serves)."""
    state = RankState(version=1, dataset_length=20, seed=5, shuffle=1, drop_last=0, even_batches=1, sampling=1,
                      epoch=0, world_size=1, rank=0, batch_size=3, global_batch=3, batches_consumed=0,
                      samples_consumed=0, epoch_finished=0, plan_digest=plan_digest([]))
    save_checkpoint({"loader": encode(state, [], sampler_state=0)}, str(tmp_path), 1)
    replace_stored(committed_dir(tmp_path, 1), "loader.rank_0.sampler",
                   archive(pickle.dumps(_MeshPayload(), protocol=2)))
    script = (f"import os, sys, torch.distributed.tensor\n"
              f"os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='{free_port()}', RANK='0', WORLD_SIZE='2')\n"
              f"from dist_resume.cli import main\nsys.exit(main(['inspect', {str(tmp_path)!r}]))\n")
    result = run_fenced("-c", script)
    assert (result.returncode, result.stdout, result.stderr) == (
        1, "", f"dist-resume: error: refused to load stored value 'loader.rank_0.sampler' of step 1 at {tmp_path}: "
               "it is not plain data (global 'torch.distributed.device_mesh.DeviceMesh' is not allowed)\n")
