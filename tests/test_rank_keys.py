"""One reading of a rank entry's key, everywhere (issue 33): ``rank_<r>`` exactly as the
loader writes it (ASCII digits, no sign, no leading zero). Anything else named ``rank_...``
(``rank_²``, ``rank_𝟘``, ``rank_00``) is one ResumeStateError or CheckpointCorruptError,
never a raw ValueError and never a second entry of one rank."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import ResumableDataLoader, load_checkpoint, plan_resume, save_checkpoint
from dist_resume.errors import CheckpointCorruptError, CheckpointError
from dist_resume.state.fields import MAX_WORLD_SIZE, ResumeStateError, rank_key, rank_of

from tests.hostile_files import edit_metadata
from tests.layout import committed_dir
from tests.merged_states import merged_from

LENGTH, BATCH = 32, 4


def _loader(rank: int = 0, world_size: int = 1) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(LENGTH)), batch_size=BATCH, shuffle=True, seed=1, rank=rank,
                               world_size=world_size)


def _state_after(batches: int, rank: int = 0, world_size: int = 1) -> dict:
    loader = _loader(rank, world_size)
    consumed = iter(loader)
    for _ in range(batches):
        next(consumed)
    return loader.state_dict()


def _malformed(key: str) -> str:
    return (f"loader state has a malformed rank key {key!r}: a rank entry is named 'rank_<r>', r written in ASCII "
            f"digits without leading zeros, below {MAX_WORLD_SIZE}")


BAD_KEYS = ["rank_²", "rank_𝟘", "rank_00", "rank_01", "rank_٠", "rank_+1", "rank_-1", "rank_ 1", "rank_1 ",
            "rank_", "rank_1_", "rank_0x1", f"rank_{MAX_WORLD_SIZE}", "rank_" + "9" * 30]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_malformed_rank_key_is_one_error_for_load_state_dict_and_plan_resume(key: str) -> None:
    state = _state_after(1)
    state[key] = state.pop("rank_0")
    for call in (lambda: _loader().load_state_dict(state), lambda: plan_resume(state, 2)):
        with pytest.raises(ResumeStateError, match=f"^{re.escape(_malformed(key))}$"):
            call()


@pytest.mark.parametrize("key", ["rank_00", "rank_𝟘", "rank_0٠"])
def test_a_second_spelling_of_a_rank_beside_its_entry_is_refused(key: str) -> None:
    """A later state under another spelling of rank 0 would have replaced the earlier one:
    8 samples never trained."""
    state = _state_after(1)
    state[key] = _state_after(3)["rank_0"]
    with pytest.raises(ResumeStateError, match=f"^{re.escape(_malformed(key))}$"):
        _loader().load_state_dict(state)


@pytest.mark.parametrize("key", ["rank_²", "rank_00"])
def test_a_save_of_a_malformed_rank_key_is_refused_before_writing(tmp_path: Path, key: str) -> None:
    state = merged_from([_loader(0, 2), _loader(1, 2)])
    state[key] = state.pop("rank_1")
    message = f"cannot save step 3: {_malformed(key)}"
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        save_checkpoint({"loader": state}, str(tmp_path), 3)
    assert not any(tmp_path.iterdir())


def test_a_checkpoint_entry_named_like_no_rank_is_damage(tmp_path: Path) -> None:
    """A loader entry renamed in .metadata (a step saved before split metadata, or read
    through .metadata): the load refuses it rather than skipping it."""
    loaders = [_loader(rank, 2) for rank in range(2)]
    for loader in loaders:
        next(iter(loader))
    save_checkpoint({"loader": merged_from(loaders)}, str(tmp_path), 1)

    def rename(metadata) -> None:
        for table in (metadata.state_dict_metadata, metadata.planner_data):
            for fqn in [fqn for fqn in table if fqn.startswith("loader.rank_1.")]:
                value = table.pop(fqn)
                if isinstance(value, tuple):
                    value = (value[0], "rank_01", *value[2:])
                table[fqn.replace("rank_1", "rank_01", 1)] = value
        for index in metadata.storage_data:
            if index.fqn.startswith("loader.rank_1."):
                object.__setattr__(index, "fqn", index.fqn.replace("rank_1", "rank_01", 1))

    edit_metadata(committed_dir(tmp_path, 1), rename)
    message = f"step 1 at {tmp_path} is damaged: {_malformed('rank_01')}"
    with pytest.raises(CheckpointCorruptError, match=f"^{re.escape(message)}$"):
        load_checkpoint({"loader": _loader(0, 3)}, str(tmp_path))


def test_accelerate_state_files_named_like_no_rank_are_refused(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    from dist_resume.integrations.accelerate import STATE_FOLDER, _read_saved_state

    folder = tmp_path / STATE_FOLDER
    folder.mkdir()
    from dist_resume import state_to_json

    (folder / "loader_0_rank_0.json").write_text(state_to_json(_state_after(1)))
    (folder / "loader_0_rank_00.json").write_text(state_to_json(_state_after(3)))
    with pytest.raises(ResumeStateError, match="loader_0_rank_00.json"):
        _read_saved_state(str(tmp_path), 0)


@settings(max_examples=400, deadline=None)
@given(suffix=st.text(max_size=12) | st.integers(-5, 2 * MAX_WORLD_SIZE).map(str)
       | st.integers(0, 99).map(lambda n: f"0{n}"))
def test_a_key_names_a_rank_only_as_the_loader_writes_it(suffix: str) -> None:
    """Over any key: either it is rank_key(r) of a rank r, read back as r, or it is refused."""
    key = f"rank_{suffix}"
    try:
        rank = rank_of(key)
    except ResumeStateError as exc:
        assert str(exc) == _malformed(key[:80])
        assert not (suffix.isascii() and suffix.isdigit() and int(suffix) < MAX_WORLD_SIZE
                    and rank_key(int(suffix)) == key)
        return
    assert rank is not None and 0 <= rank < MAX_WORLD_SIZE and rank_key(rank) == key


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(BAD_KEYS), later=st.integers(1, 7), world_size=st.integers(1, 3))
def test_no_spelling_of_a_rank_replaces_its_entry(key: str, later: int, world_size: int) -> None:
    """Any merged state with a second spelling of one rank is refused by every reader."""
    state = merged_from(_loader(rank, world_size) for rank in range(world_size))
    state[key] = _state_after(min(later, LENGTH // (BATCH * world_size)), 0, world_size)["rank_0"]
    for call in (lambda: _loader(0, world_size).load_state_dict(state), lambda: plan_resume(state, 2)):
        with pytest.raises(ResumeStateError):
            call()


def test_the_json_form_of_a_state_uses_the_same_reading(tmp_path: Path) -> None:
    from dist_resume import state_from_json, state_to_json

    text = json.loads(state_to_json(_state_after(1)))
    text = json.dumps({("rank_𝟘" if key == "rank_0" else key): value for key, value in text.items()})
    with pytest.raises(ResumeStateError, match=re.escape(_malformed("rank_𝟘"))):
        _loader().load_state_dict(state_from_json(text))
