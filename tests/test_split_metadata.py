"""An elastic load reads the split metadata of a save (issue 24, point 10): everything but the
loaders' rank entries, and its own rank's record, never DCP's whole ``.metadata`` (22 MB at
100,000 saved ranks); damaged or crafted split files are one error each (G8)."""

from __future__ import annotations

import pickle
import re
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import RandomSampler

import dist_resume.checkpoint.bounded_files as bounded_files
from dist_resume import ResumableDataLoader, load_checkpoint, read_loader_states, save_checkpoint
from dist_resume.checkpoint.split_metadata import RANK_ENTRIES, SHARED
from dist_resume.errors import CheckpointCorruptError, UnsafeCheckpointError
from tests import rank_agreement_worker
from tests.checkpoint_worker import run
from tests.layout import committed_dir, forget_digests
from tests.s3_server import free_port

_MAGIC, _MAGIC_2 = (struct.unpack("<q", name)[0] for name in (b"DRANKMD1", b"DRANKMD2"))


def _sampled(rank: int, world_size: int) -> ResumableDataLoader:
    """A loader whose rank entries hold an own field (the sampler's generator, 'sampler_rng');
    resumed at its saved world size only (a custom sampler is not re-partitioned)."""
    return ResumableDataLoader(list(range(30)), sampler=RandomSampler(range(30), generator=torch.Generator()),
                               batch_size=2, rank=rank, world_size=world_size)


def _shuffled(rank: int, world_size: int) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(60)), batch_size=2, shuffle=True, seed=5, rank=rank, world_size=world_size)


def _plain(loader: ResumableDataLoader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def _save(url: Path, world_size: int, steps: int = 2, make=_sampled) -> None:
    merged: dict = {}
    for rank in range(world_size):
        loader = make(rank, world_size)
        iterator = iter(loader)
        for _ in range(steps):
            next(iterator)
        merged.update(loader.state_dict())
    save_checkpoint({"loader": merged}, str(url), 1)


def _files_read(monkeypatch) -> list[str]:
    """The names of the checkpoint files read from (a call per read, a chunk per stream read)."""
    reads: list[str] = []
    original_range, original_at = bounded_files.read_range, bounded_files._read_at

    def counted(loc, path, offset, length, where):
        reads.append(Path(path).name)
        return original_range(loc, path, offset, length, where)

    def counted_at(loc, path, fd, offset, length):
        reads.append(Path(path).name)
        return original_at(loc, path, fd, offset, length)

    for module in ("bounded_files", "bounded_reader", "rank_records"):
        monkeypatch.setattr(f"dist_resume.checkpoint.{module}.read_range", counted)
    monkeypatch.setattr("dist_resume.checkpoint.bounded_files._read_at", counted_at)
    return reads


def _records(step_dir: Path) -> tuple[list[int], list[bytes]]:
    """The ranks listed by the step's rank-entries file and their records (either layout)."""
    data = (step_dir / RANK_ENTRIES).read_bytes()
    magic, count = struct.unpack_from("<2q", data)
    columns = {_MAGIC: 2, _MAGIC_2: 3}[magic]
    words = struct.unpack_from(f"<{columns * count}q", data, 16)
    ranks, ends = list(words[:count]), words[count:2 * count]
    start = 16 + 8 * columns * count
    return ranks, [data[start + begin:start + end] for begin, end in zip((0, *ends), ends)]


def _write_records(step_dir: Path, ranks: list[int], records: list[bytes]) -> None:
    """The rank-entries file in the layout written before records had digests (the ranks
    listed, no sums), the digests of the commit forgotten: what its structure alone refuses."""
    ends, at = [], 0
    for record in records:
        at += len(record)
        ends.append(at)
    header = struct.pack(f"<{2 + 2 * len(ranks)}q", _MAGIC, len(ranks), *ranks, *ends)
    (step_dir / RANK_ENTRIES).write_bytes(header + b"".join(records))
    forget_digests(step_dir)


def test_an_elastic_load_reads_the_same_whatever_the_number_of_saved_ranks(tmp_path: Path, monkeypatch) -> None:
    reads = _files_read(monkeypatch)
    found = []
    for saved_ranks in (3, 12):
        url = tmp_path / str(saved_ranks)
        _save(url, saved_ranks, make=_shuffled)
        # the table carries every field of these entries: every saved rank's record is empty
        assert _records(committed_dir(url, 1)) == (list(range(saved_ranks)), [b""] * saved_ranks)
        for rank in range(2):
            reads.clear()
            loader, reference = _shuffled(rank, 2), _shuffled(rank, 2)
            assert load_checkpoint({"loader": loader}, str(url)) == 1
            found.append(reads[:])
            reference.load_state_dict(read_loader_states(str(url))[1])
            assert _plain(loader) == _plain(reference) and _plain(loader)
    # the commit marker, the shared metadata, the records' header (magic and count, then the
    # index; the rank's own record is empty) and the table's column
    assert found == [[".committed", SHARED, RANK_ENTRIES, RANK_ENTRIES, "__0_0.distcp"]] * 4


def test_a_same_size_resume_reads_its_own_record_only(tmp_path: Path, monkeypatch) -> None:
    reads = _files_read(monkeypatch)
    _save(tmp_path, 3)
    assert _records(committed_dir(tmp_path, 1))[0] == [0, 1, 2]  # an own field on every rank
    for rank in range(3):
        reads.clear()
        loader, reference = _sampled(rank, 3), _sampled(rank, 3)
        assert load_checkpoint({"loader": loader}, str(tmp_path)) == 1
        assert ".metadata" not in reads and reads.count(RANK_ENTRIES) == 3  # the header, the index, its record
        reference.load_state_dict(read_loader_states(str(tmp_path))[1])
        assert _plain(loader) == _plain(reference) and _plain(loader)


def test_a_step_without_split_metadata_loads_from_the_whole_metadata(tmp_path: Path, monkeypatch) -> None:
    """Steps saved before split metadata: the same load through ``.metadata``."""
    _save(tmp_path / "split", 3)
    _save(tmp_path / "whole", 3)
    for name in (SHARED, RANK_ENTRIES):
        (committed_dir(tmp_path / "whole", 1) / name).unlink()
    forget_digests(committed_dir(tmp_path / "whole", 1), "shared", "rank_index")
    reads = _files_read(monkeypatch)
    for rank in range(3):
        loaders = {}
        for run_name in ("split", "whole"):
            reads.clear()
            loaders[run_name] = _sampled(rank, 3)
            load_checkpoint({"loader": loaders[run_name]}, str(tmp_path / run_name))
            assert (".metadata" in reads) == (run_name == "whole")
        assert _plain(loaders["split"]) == _plain(loaders["whole"])


def test_a_plain_state_dict_receives_every_saved_ranks_entry_through_the_whole_metadata(tmp_path: Path) -> None:
    """A loader key given a plain dict (not a Stateful) receives every saved rank's entries."""
    _save(tmp_path, 3)
    state = {"loader": {}}
    load_checkpoint(state, str(tmp_path))
    assert sorted(name for name in state["loader"] if name.startswith("rank_")) == ["rank_0", "rank_1", "rank_2"]
    assert all("sampler_rng" in state["loader"][f"rank_{rank}"] for rank in range(3))


def _load(url: Path, rank: int = 1, world_size: int = 2) -> None:
    """Load into rank ``rank`` of a job of the saved world size."""
    load_checkpoint({"loader": _sampled(rank, world_size)}, str(url))


def test_a_record_holding_another_ranks_entries_is_refused(tmp_path: Path) -> None:
    _save(tmp_path, 3)
    step_dir = committed_dir(tmp_path, 1)
    ranks, records = _records(step_dir)
    _write_records(step_dir, ranks, [records[0], records[0], records[2]])  # rank 1's record is rank 0's
    _load(tmp_path, rank=0, world_size=3)  # rank 0's own record is whole
    with pytest.raises(CheckpointCorruptError, match=re.escape(
            f"step 1 at {tmp_path} is damaged: rank 1's record in {RANK_ENTRIES} holds other entries than that "
            "rank's")):
        _load(tmp_path, rank=1, world_size=3)


def test_a_record_that_moves_a_shared_entrys_data_is_refused(tmp_path: Path) -> None:
    """A record may name the stored data of its own entries only, not redirect the table's."""
    _save(tmp_path, 2)
    step_dir = committed_dir(tmp_path, 1)
    ranks, records = _records(step_dir)
    record = pickle.loads(records[1])
    shared = pickle.loads((step_dir / SHARED).read_bytes())
    table_index = next(index for index in shared.storage_data if "table_of_ranks" in index.fqn)
    record.storage_data[table_index] = next(iter(record.storage_data.values()))
    _write_records(step_dir, ranks, [records[0], pickle.dumps(record)])
    with pytest.raises(CheckpointCorruptError, match="holds other entries than that rank's"):
        _load(tmp_path, rank=1)


def test_a_shared_metadata_file_naming_a_global_is_refused_without_importing_it(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    step_dir = committed_dir(tmp_path, 1)
    (step_dir / SHARED).write_bytes(b"cos\nsystem\n.")  # the global os.system, in pickle's protocol 0
    with pytest.raises(UnsafeCheckpointError, match="global 'os.system' is not allowed"):
        _load(tmp_path)


def test_a_shared_metadata_file_pointing_past_the_stored_bytes_is_refused(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    step_dir = committed_dir(tmp_path, 1)
    shared = pickle.loads((step_dir / SHARED).read_bytes())
    last = max(shared.storage_data.values(), key=lambda info: info.offset)  # no range after it to overlap
    last.length = 10**12
    (step_dir / SHARED).write_bytes(pickle.dumps(shared))
    forget_digests(step_dir)
    with pytest.raises(CheckpointCorruptError, match=re.escape("its metadata needs")):
        _load(tmp_path)


@pytest.mark.parametrize("edit, problem", [
    (lambda data: b"X" + data[1:], "has no valid header"),
    (lambda data: data[:8] + struct.pack("<q", 2**40) + data[16:], "has no valid header"),
    (lambda data: data[:8] + struct.pack("<q", -1) + data[16:], "has no valid header"),
    (lambda data: data[:12], "is cut short"),
    (lambda data: data[:20], "is cut short"),
    (lambda data: data + b"\x00", "the index of .metadata_of_rank_entries does not match its records"),
    (lambda data: data[:-1], "the index of .metadata_of_rank_entries does not match its records"),
    (lambda data: data[:16] + struct.pack("<q", 1) + data[24:], "does not match its records"),  # ranks 1, 1
])
def test_a_damaged_records_file_is_one_error(tmp_path: Path, edit, problem: str) -> None:
    _save(tmp_path, 2)
    path = committed_dir(tmp_path, 1) / RANK_ENTRIES
    path.write_bytes(edit(path.read_bytes()))
    with pytest.raises(CheckpointCorruptError, match=re.escape(problem)):
        _load(tmp_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damage_to_the_records_file_is_the_right_load_or_one_error(tmp_path_factory, data) -> None:
    """Bytes of the header or of the records replaced at random: the load gives the loader
    saved (the damage missed what rank 1 reads) or one CheckpointCorruptError / UnsafeCheckpointError."""
    url = tmp_path_factory.mktemp("run")
    _save(url, 2)
    path = committed_dir(url, 1) / RANK_ENTRIES
    original = path.read_bytes()
    reference = _sampled(1, 2)
    load_checkpoint({"loader": reference}, str(url))
    at = data.draw(st.integers(0, len(original) - 1))
    replaced = data.draw(st.binary(min_size=1, max_size=16))
    path.write_bytes(original[:at] + replaced + original[at + len(replaced):])
    loader = _sampled(1, 2)
    try:
        load_checkpoint({"loader": loader}, str(url))
    except (CheckpointCorruptError, UnsafeCheckpointError):
        return
    assert _plain(loader) == _plain(reference)


@pytest.mark.slow
def test_a_record_damaged_for_one_rank_fails_every_rank_at_once(tmp_path: Path) -> None:
    """Each rank reads its own record; rank 1's is damaged. Rank 0 used to be able to go on
    into DCP's collectives and wait for the group timeout (60 s; the launcher's 40 s ends the
    test then): now both ranks raise at once."""
    url, out = tmp_path / "run", tmp_path / "out"
    _save(url, 2)
    step_dir = committed_dir(url, 1)
    ranks, records = _records(step_dir)
    _write_records(step_dir, ranks, [records[0], records[0]])
    run("damaged_own_record", 2, {"out": str(out), "url": str(url)}, free_port(),
        script=rank_agreement_worker.__file__, timeout=40)
    errors = [(out / f"own_record-error-{rank}.txt").read_text() for rank in (0, 1)]
    assert errors == [
        f"CheckpointError: cannot load step 1 at {url}: it failed on rank 1 (that rank's error says why)",
        f"CheckpointCorruptError: step 1 at {url} is damaged: rank 1's record in {RANK_ENTRIES} holds other "
        "entries than that rank's"]


@pytest.mark.parametrize("name", [".metadata", SHARED])
def test_a_metadata_object_without_its_fields_is_one_error(tmp_path: Path, name: str) -> None:
    """A crafted pickle can build DCP's Metadata without the fields its class declares (found by
    the fuzz test above): one CheckpointCorruptError, not an AttributeError from the checks."""
    _save(tmp_path, 2)
    step_dir = committed_dir(tmp_path, 1)
    metadata = pickle.loads((step_dir / name).read_bytes())
    del metadata.state_dict_metadata
    (step_dir / name).write_bytes(pickle.dumps(metadata))
    forget_digests(step_dir)
    if name == ".metadata":
        for split in (SHARED, RANK_ENTRIES):
            (step_dir / split).unlink()
    with pytest.raises(CheckpointCorruptError, match=re.escape(
            f"step 1 at {tmp_path} is damaged: its metadata is malformed (AttributeError)")):
        _load(tmp_path)


def test_a_step_that_lost_its_whole_metadata_is_damaged_though_the_load_does_not_read_it(tmp_path: Path) -> None:
    """read_loader_states, inspect and plain dcp.load need it: the load reports the damage now."""
    _save(tmp_path, 2, make=_shuffled)
    (committed_dir(tmp_path, 1) / ".metadata").unlink()
    with pytest.raises(CheckpointCorruptError,
                       match=re.escape(f"step 1 at {tmp_path} is damaged: .metadata is missing")):
        load_checkpoint({"loader": _shuffled(0, 3)}, str(tmp_path))
