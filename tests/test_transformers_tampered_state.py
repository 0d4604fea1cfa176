"""A tampered loader state in a Trainer checkpoint's trainer_state.json (issue 33 "raw
errors"): any one-field edit of the mixin's entry is refused with one ResumeStateError before
the first batch, or changes nothing the resumed run trains. Hypothesis over one-field edits
of a state a real Trainer saved, resumed through the mixin's callback as Trainer calls it;
and one tampered checkpoint resumed by a real Trainer."""

from __future__ import annotations

import copy
import json
import re
from typing import Any, NamedTuple

import pytest

pytest.importorskip("transformers")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from transformers import TrainerControl, TrainerState  # noqa: E402

from dist_resume import ResumableDataLoader, ResumeStateError  # noqa: E402
from dist_resume.integrations.transformers import CALLBACK_NAME  # noqa: E402
from tests.transformers_worker import SEED, Indices, build_trainer  # noqa: E402

STEP = 6  # 24 of epoch 0's 36 samples, in batches of 4


class Saved(NamedTuple):
    state: dict[str, Any]  # trainer_state.json
    args: Any  # the TrainingArguments it trained with
    callback: type  # the mixin's callback class


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Saved:
    """A real Trainer's checkpoint at step 6."""
    out = tmp_path_factory.mktemp("trainer")
    trainer = build_trainer(str(out), 4, STEP, STEP)
    trainer.train()
    callback = next(type(c) for c in trainer.callback_handler.callbacks if type(c).__name__ == CALLBACK_NAME)
    state = json.loads((out / "checkpoints" / f"checkpoint-{STEP}" / "trainer_state.json").read_text())
    return Saved(state, trainer.args, callback)


def _rest_of_epoch(saved: Saved, state: dict[str, Any]) -> list[list[int]]:
    """What the mixin's callback makes of ``state`` at the start of a resumed run, called as
    Trainer calls it: the batches the loader then serves in the rest of the epoch."""
    loader = ResumableDataLoader(Indices(), batch_size=4, shuffle=True, seed=SEED)
    saved.callback().on_train_begin(saved.args, TrainerState(**copy.deepcopy(state)), TrainerControl(),
                                    train_dataloader=loader)
    return [batch["index"].tolist() for batch in loader]


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every place in ``value`` (a JSON value) that one edit can change."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_paths(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_paths(item, (*path, index)))
    return found


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from([2**63 - 1, -2**63, 2**64, -1, 0, 1])
    | st.floats() | st.text(max_size=6) | st.sampled_from(["int64", "float32", "bool", "Tensor", "__tensor__"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


@st.composite
def one_field_edits(draw: st.DrawFn, entry: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``entry`` with one field replaced, removed or added, and what was done."""
    edited = copy.deepcopy(entry)
    path = draw(st.sampled_from(_paths(edited)))
    parent = edited
    for key in path[:-1]:
        parent = parent[key]
    kind = draw(st.sampled_from(["replace", "remove", "add"] if path else ["replace"]))
    if not path:
        return draw(json_values), "entry replaced"
    last = path[-1]
    if kind == "replace":
        old = parent[last]
        new = draw(json_values | (st.integers(-3, 3).map(lambda d: old + d) if type(old) is int else json_values))
        parent[last] = new
    elif kind == "remove":
        del parent[last]
    elif isinstance(parent, dict):
        parent[draw(st.text(max_size=6))] = draw(json_values)
    else:
        parent.insert(last, draw(json_values))
    return edited, f"{kind} at {path}"


def test_an_unedited_state_resumes_on_the_exact_next_batch(saved: Saved) -> None:
    loader = ResumableDataLoader(Indices(), batch_size=4, shuffle=True, seed=SEED)
    assert _rest_of_epoch(saved, saved.state) == [batch["index"].tolist() for batch in loader][STEP:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_one_field_edit_is_refused_before_the_first_batch_or_changes_nothing(
        saved: Saved, data: st.DataObject) -> None:
    callbacks = saved.state["stateful_callbacks"]
    edited, what = data.draw(one_field_edits(callbacks[CALLBACK_NAME]))
    tampered = {**saved.state, "stateful_callbacks": {**callbacks, CALLBACK_NAME: edited}}
    try:
        resumed = _rest_of_epoch(saved, tampered)
    except ResumeStateError:
        return
    assert resumed == _rest_of_epoch(saved, saved.state), what


def test_a_trainer_resuming_a_tampered_checkpoint_is_refused_before_its_first_batch(tmp_path) -> None:
    build_trainer(str(tmp_path), 4, STEP, STEP).train()
    state_file = tmp_path / "checkpoints" / f"checkpoint-{STEP}" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["stateful_callbacks"][CALLBACK_NAME]["attributes"]["loader_state"]["rank_0"]["progress"]["shape"] = []
    state_file.write_text(json.dumps(state))
    with pytest.raises(ResumeStateError, match="^" + re.escape(
            f"the checkpoint of global step {STEP} holds a damaged loader state in trainer_state.json "
            f"(stateful_callbacks['{CALLBACK_NAME}']): loader state JSON at state['rank_0']['progress'] holds 18 "
            "values for the shape []") + "$"):
        build_trainer(str(tmp_path), 4, 12, STEP).train(resume_from_checkpoint=str(state_file.parent))
    trained = [json.loads(line)["step"] for line in (tmp_path / "rank_0.jsonl").read_text().splitlines()]
    assert trained == list(range(1, STEP + 1))
