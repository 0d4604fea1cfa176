"""Careless arguments to the checkpoint functions (issue 11 point 5): one clear TypeError or
ValueError naming the argument, and nothing saved is touched."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from dist_resume import list_checkpoints, load_checkpoint, read_loader_states, save_checkpoint


def _committed(url: Path) -> list[int]:
    return [info.step for info in list_checkpoints(str(url))]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    url = tmp_path / "run"
    for step in (100, 200, 300):
        save_checkpoint({"w": torch.full((2,), float(step))}, str(url), step)
    return url


SAVE_CASES = [
    (dict(step="400"), TypeError, "step must be an int, got str '400'"),
    (dict(step=400.0), TypeError, "step must be an int, got float 400.0"),
    (dict(step=True), TypeError, "step must be an int, got bool True"),
    (dict(step=-1), ValueError, "step must be an int >= 0, got -1"),
    (dict(step=None), TypeError, "step must be an int, got NoneType None"),
    (dict(keep=True), TypeError, "keep must be an int, got bool True"),
    (dict(keep=0), ValueError, "keep must be an int >= 1, got 0"),
    (dict(keep=-2), ValueError, "keep must be an int >= 1, got -2"),
    (dict(keep="1"), TypeError, "keep must be an int, got str '1'"),
    (dict(keep=1.0), TypeError, "keep must be an int, got float 1.0"),
    (dict(async_save="no"), TypeError, "async_save must be True or False, got str 'no'"),
    (dict(url="   "), ValueError, "url must name a checkpoint location, got '   '"),
    (dict(url=""), ValueError, "url must name a checkpoint location, got ''"),
    (dict(url=None), TypeError, "url must be a str or a path, got NoneType"),
    (dict(url=b"/tmp/run"), TypeError, "url must be a str or a path, got bytes"),
]


@pytest.mark.parametrize("kwargs, error, message", SAVE_CASES,
                         ids=[f"{next(iter(k))}={next(iter(k.values()))!r}" for k, _, _ in SAVE_CASES])
def test_careless_save_arguments_are_refused_and_nothing_is_touched(run, kwargs, error, message):
    arguments = dict(url=str(run), step=400, keep=2) | kwargs
    state = {"w": torch.zeros(2)}
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        save_checkpoint(state, arguments.pop("url"), arguments.pop("step"), **arguments)
    assert _committed(run) == [100, 200, 300]


def test_numpy_integers_are_integers(run):
    save_checkpoint({"w": torch.zeros(2)}, str(run), np.int64(400), keep=np.int32(2))
    assert _committed(run) == [300, 400]
    assert load_checkpoint({"w": torch.zeros(2)}, str(run), np.uint16(300)) == 300


def test_surrounding_whitespace_in_a_url_is_refused_without_its_credentials(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            "url must not start or end with whitespace, got ' s3://bucket/run'")):
        save_checkpoint({"w": torch.zeros(2)}, " s3://KEY:SECRET@bucket/run", 1)
    with pytest.raises(ValueError, match=re.escape(
            f"url must not start or end with whitespace, got '{tmp_path}/run\\n'")):
        load_checkpoint({"w": torch.zeros(2)}, f"{tmp_path}/run\n")


@pytest.mark.parametrize("step, error, message", [
    ("300", TypeError, "step must be an int, got str '300'"),
    (300.0, TypeError, "step must be an int, got float 300.0"),
    (True, TypeError, "step must be an int, got bool True"),
    (-300, ValueError, "step must be an int >= 0, got -300"),
])
def test_careless_load_steps_are_refused(run, step, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        load_checkpoint({"w": torch.zeros(2)}, str(run), step)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        read_loader_states(str(run), step)


@pytest.mark.parametrize("url, error, message", [
    ("  ", ValueError, "url must name a checkpoint location, got '  '"),
    (None, TypeError, "url must be a str or a path, got NoneType"),
])
def test_careless_urls_are_refused_everywhere(url, error, message):
    for call in (lambda: load_checkpoint({}, url), lambda: read_loader_states(url),
                 lambda: list_checkpoints(url)):
        with pytest.raises(error, match=f"^{re.escape(message)}$"):
            call()


@pytest.mark.parametrize("url, message", [
    ("s3:/bucket/run", "url starts with 's3:/', not 's3://': did you mean 's3://bucket/run'? "
                       "(a local path whose first part holds a colon must start with './')"),
    ("s3:bucket/run", "url starts with 's3:', not 's3://': did you mean 's3://bucket/run'? "
                      "(a local path whose first part holds a colon must start with './')"),
    ("file:/tmp/run", "url starts with 'file:/', not 'file://': did you mean 'file:///tmp/run'? "
                      "(a local path whose first part holds a colon must start with './')"),
    ("s3:/KEY:SECRET@bucket/run", "url starts with 's3:/', not 's3://': did you mean 's3://bucket/run'? "
                                  "(a local path whose first part holds a colon must start with './')"),
])
def test_a_malformed_scheme_is_refused_and_writes_nothing(tmp_path, monkeypatch, url, message):
    """'s3:/bucket/run' is a valid local path: saved there, a job would write ./s3:/bucket/run
    on its own disk and never reach the object store."""
    monkeypatch.chdir(tmp_path)
    calls = (lambda: save_checkpoint({"w": torch.zeros(2)}, url, 1), lambda: load_checkpoint({}, url),
             lambda: read_loader_states(url), lambda: list_checkpoints(url))
    for call in calls:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            call()
    assert list(tmp_path.iterdir()) == []


def test_a_local_path_with_a_colon_is_taken_with_dot_slash(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_checkpoint({"w": torch.ones(2)}, "./s3:/bucket/run", 1)
    assert (tmp_path / "s3:" / "bucket" / "run" / "step_00000001" / ".committed").is_file()
    assert [info.step for info in list_checkpoints("./s3:/bucket/run")] == [1]
