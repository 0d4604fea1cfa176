"""Sizes that storage or a file claims are claims (G8, issue 33): a checkpoint file is read in
chunks up to a limit, a pickled one front to back as it is unpickled, so that a sparse file
of 64 GiB, or a header declaring more than memory, is one clear error in a process whose
address space is capped, never a MemoryError."""

from __future__ import annotations

import hashlib
import io
import pickle
import re
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import ResumableDataLoader, save_checkpoint
from dist_resume.checkpoint.bounded_files import LARGEST_READ, BoundedStream, read_whole
from dist_resume.checkpoint.split_metadata import SHARED
from dist_resume.errors import CheckpointCorruptError
from dist_resume.storage import resolve

from tests.hostile_files import edit_metadata, outcome, run_fenced
from tests.layout import committed_dir, forget_digests

HUGE = 64 * 2**30
UNDER_THE_LIMIT = 3 * 2**30  # below the limit of a metadata file, above what a fenced process may map


def _saved(url: Path) -> Path:
    loader = ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=3)
    next(iter(loader))
    save_checkpoint({"loader": loader, "weights": torch.ones(3)}, str(url), 1)
    return committed_dir(url, 1)


def _sparse(path: Path, prefix: bytes = b"", size: int = HUGE) -> None:
    """``path`` as ``prefix`` followed by a hole up to ``size`` bytes (no disk space used)."""
    with open(path, "wb") as file:
        file.write(prefix)
        file.truncate(size)


def _not_metadata(path: Path) -> str:
    return (f"UnsafeCheckpointError: refused to load {path}: not a DCP metadata file (UnpicklingError: invalid load "
            "key, '\\x00'.)")


def _larger_than_allowed(where: str, name: str) -> str:
    return f"CheckpointCorruptError: {where} is damaged: {name} has {HUGE} bytes, more than {2**32}"


def _load_code(url: Path) -> str:
    return (f"load_checkpoint({{'loader': ResumableDataLoader(list(range(20)), batch_size=2, shuffle=True, seed=3), "
            f"'weights': __import__('torch').zeros(3)}}, {str(url)!r})")


@pytest.mark.parametrize("size", [HUGE, UNDER_THE_LIMIT])
def test_a_sparse_shared_metadata_file_is_one_error(tmp_path: Path, size: int) -> None:
    step_dir = _saved(tmp_path)
    _sparse(step_dir / SHARED, size=size)
    assert outcome(_load_code(tmp_path)) == (_larger_than_allowed(f"step 1 at {tmp_path}", SHARED) if size == HUGE
                                             else _not_metadata(step_dir / SHARED))


@pytest.mark.parametrize("size", [HUGE, UNDER_THE_LIMIT])
def test_a_sparse_whole_metadata_is_one_error_for_read_loader_states_and_inspect(tmp_path: Path, size: int) -> None:
    step_dir = _saved(tmp_path)
    _sparse(step_dir / ".metadata", size=size)
    expected = (_larger_than_allowed(f"step 1 at {tmp_path}", ".metadata") if size == HUGE
                else _not_metadata(step_dir / ".metadata"))
    assert outcome(f"read_loader_states({str(tmp_path)!r})") == expected
    result = run_fenced("-m", "dist_resume", "inspect", str(tmp_path))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"dist-resume: error: {expected.split(': ', 1)[1]}\n"


def test_a_metadata_file_with_a_sparse_tail_is_damaged(tmp_path: Path) -> None:
    """Its pickle whole, then gigabytes of nothing: the tail is never read, and it is damage."""
    step_dir = _saved(tmp_path)
    data = (step_dir / ".metadata").read_bytes()
    _sparse(step_dir / ".metadata", data, UNDER_THE_LIMIT)
    assert outcome(f"read_loader_states({str(tmp_path)!r})") == (
        f"CheckpointCorruptError: step 1 at {tmp_path} is damaged: .metadata holds {UNDER_THE_LIMIT - len(data)} "
        "bytes after its end")


def test_a_metadata_file_declaring_more_than_memory_is_one_error(tmp_path: Path) -> None:
    """Pickle's BINBYTES8 declaring 1 TiB in a file of a few bytes (the step's digests
    forgotten, as for a step saved before they were recorded)."""
    step_dir = _saved(tmp_path)
    (step_dir / ".metadata").write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 2**40) + b"\x00" * 16 + b".")
    forget_digests(step_dir)
    assert outcome(f"read_loader_states({str(tmp_path)!r})") == (
        f"UnsafeCheckpointError: refused to load {step_dir / '.metadata'}: it declares an object larger than "
        "memory (damaged or crafted)")


def test_a_sparse_commit_marker_is_one_error(tmp_path: Path) -> None:
    _saved(tmp_path)
    _sparse(tmp_path / "step_00000001" / ".committed")
    message = f"step 1 at {tmp_path} is damaged: .committed has {HUGE} bytes, more than 65536"
    for code in (f"list_checkpoints({str(tmp_path)!r})", f"read_loader_states({str(tmp_path)!r})"):
        assert outcome(code) == f"CheckpointCorruptError: {message}"


def _inflate_range(fqn: str, length: int):
    def edit(metadata) -> None:
        (index,) = [index for index in metadata.storage_data if index.fqn == fqn]
        metadata.storage_data[index].length = length

    return edit


def test_a_stored_tensor_claiming_more_bytes_than_it_holds_is_refused_before_reading(tmp_path: Path) -> None:
    """Its range to the end of a sparse shard of 64 GiB: refused by what the tensor's size
    needs, before anything is allocated (a step saved before digests, whose .metadata is its
    only word)."""
    step_dir = _saved(tmp_path)
    metadata = pickle.loads((step_dir / ".metadata").read_bytes())
    (index,) = [index for index in metadata.storage_data if index.fqn == "weights"]
    info = metadata.storage_data[index]
    assert info.offset == max(other.offset for other in metadata.storage_data.values())  # the shard's last range
    shard = step_dir / info.relative_path
    _sparse(shard, shard.read_bytes())
    edit_metadata(step_dir, _inflate_range("weights", HUGE - info.offset))
    assert outcome(f"load_checkpoint({{'weights': __import__('torch').zeros(3)}}, {str(tmp_path)!r})") == (
        f"CheckpointCorruptError: step 1 at {tmp_path} is damaged: tensor 'weights' is stored in "
        f"{HUGE - info.offset} bytes, more than its 12 bytes of data need")


def test_a_large_stored_value_of_zeros_is_refused_before_reading(tmp_path: Path) -> None:
    """A stored value (not a tensor: no size of its own) moved to a sparse file of 900 MiB:
    its first and last bytes are not an archive's, and nothing more is read."""
    save_checkpoint({"weights": torch.ones(3), "extra": {"epoch": 3}}, str(tmp_path), 1)
    step_dir = committed_dir(tmp_path, 1)
    length = 900 * 2**20
    _sparse(step_dir / "__9_0.distcp", size=length)

    def move(metadata) -> None:
        (index,) = [index for index in metadata.storage_data if index.fqn == "extra.epoch"]
        info = metadata.storage_data[index]
        info.relative_path, info.offset, info.length = "__9_0.distcp", 0, length

    edit_metadata(step_dir, move)
    assert outcome(f"load_checkpoint({{'weights': __import__('torch').zeros(3), 'extra': {{'epoch': 0}}}}, "
                   f"{str(tmp_path)!r})") == (
        f"CheckpointCorruptError: 'extra.epoch' of step 1 at {tmp_path} is damaged: its {length} bytes are not a stored "
        "torch value")


def test_accelerate_state_files_are_read_bounded(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from dist_resume.integrations.accelerate import STATE_FOLDER

    (tmp_path / STATE_FOLDER).mkdir()
    _sparse(tmp_path / STATE_FOLDER / "loader_0_rank_0.json", b"{")
    code = ("from dist_resume.integrations.accelerate import _read_saved_state\n    "
            f"_read_saved_state({str(tmp_path)!r}, 0)")
    path = tmp_path / STATE_FOLDER / "loader_0_rank_0.json"
    assert outcome(code) == (f"ResumeStateError: loader state file {path} is damaged: loader_0_rank_0.json has "
                             f"{HUGE} bytes, more than {2**28}")


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), limit=st.integers(0, 4000), reads=st.lists(st.integers(0, 700), max_size=12),
       chunk=st.sampled_from([1, 7, 64, 4096]))
def test_a_bounded_stream_reads_the_file_and_never_past_its_limit(tmp_path_factory, data: bytes, limit: int,
                                                                  reads: list[int], chunk: int) -> None:
    """Over any file, limit and reads: the bytes of the file in order (as io.BytesIO gives
    them), its digest that of what was consumed; past the limit, one CheckpointCorruptError
    (and never a byte beyond ``limit`` fetched)."""
    import dist_resume.checkpoint.bounded_files as bounded_files

    folder = tmp_path_factory.mktemp("stream")
    (folder / "file").write_bytes(data)
    loc = resolve(str(folder))
    expected, consumed = io.BytesIO(data), b""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bounded_files, "CHUNK", chunk)
        try:
            with BoundedStream(loc, str(folder / "file"), "the test", limit) as stream:
                for size in reads:
                    got = stream.read(size)
                    assert got == expected.read(size)
                    consumed += got
                    assert stream.digest() == hashlib.sha256(consumed).hexdigest()
                assert stream.read_to_end() == expected.read()
        except CheckpointCorruptError as exc:
            assert len(data) > limit
            assert str(exc) in (f"the test is damaged: file has {len(data)} bytes, more than {limit}",
                                f"the test is damaged: file holds more than {limit} bytes")
            return
    assert len(data) <= limit


@settings(max_examples=100, deadline=None)
@given(value=st.recursive(st.none() | st.integers() | st.text(max_size=40) | st.binary(max_size=40),
                          lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=6), max_leaves=60),
       protocol=st.integers(0, 5))
def test_a_pickle_read_through_a_bounded_stream_is_the_pickle(tmp_path_factory, value, protocol: int) -> None:
    """An unpickler reading from the stream gets the value pickled, having consumed exactly
    the pickle's bytes, whatever the protocol (framed or not)."""
    folder = tmp_path_factory.mktemp("pickle")
    data = pickle.dumps(value, protocol=protocol)
    (folder / "file").write_bytes(data + b"tail")
    with BoundedStream(resolve(str(folder)), str(folder / "file"), "the test", 2**20) as stream:
        assert pickle.Unpickler(stream).load() == value
        assert stream.consumed == len(data)
        assert stream.digest() == hashlib.sha256(data).hexdigest()


def test_one_declared_object_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(bytes(100))
    with BoundedStream(resolve(str(tmp_path)), str(tmp_path / "file"), "the test", 2**40) as stream:
        with pytest.raises(CheckpointCorruptError, match=re.escape(
                f"the test is damaged: file declares an object of {LARGEST_READ + 1} bytes, more than {LARGEST_READ}")):
            stream.read(LARGEST_READ + 1)
    assert read_whole(resolve(str(tmp_path)), str(tmp_path / "file"), "the test", 100) == bytes(100)
