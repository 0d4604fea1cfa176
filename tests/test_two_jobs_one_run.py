"""Issue 32 point 2: a save that finds its step committed says who committed it (G10): this
job (saving one step twice), the run before this job came to it (a step counter that went
back), or another job since this job loaded (two jobs wrote the run: which steps, what to
do). Before, all three were one bare "step N is already committed".

This process is one job; the other job is a process of its own (tests/script_processes.py).
The same error from real torchrun jobs, with the README's script: tests/test_readme_kill.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from dist_resume import CheckpointExistsError, list_checkpoints, load_checkpoint, save_checkpoint
from tests.script_processes import ScriptProcess

OTHER_JOB = """
import sys, torch
from dist_resume import save_checkpoint
for step in sys.argv[2:]:
    save_checkpoint({"w": torch.full((2,), float(step))}, sys.argv[1], int(step))
"""

TWO_JOBS = ("cannot save step {step} at {url}: another job committed it. Two jobs wrote this run: since {since}, "
            "another job committed {steps}. Nothing of this save was written, and the committed steps are "
            "unchanged. Stop the other job (a launcher killed with kill -9 leaves workers running that do not end "
            "with it: see docs/operations.md), then start this job again: it resumes from the newest committed step")


def _other_job(tmp_path: Path, url: str, *steps: int, take_over: bool = False) -> None:
    script = tmp_path / "other_job.py"
    script.write_text(OTHER_JOB)
    env = {"PATH": "/usr/bin:/bin", **({"DIST_RESUME_TAKE_OVER": "1"} if take_over else {})}
    log = tmp_path / "other_job.log"
    process = ScriptProcess(str(script), [url, *map(str, steps)], env, log)
    assert process.wait(timeout=300) == 0, log.read_text()


def _save(url: str, step: int) -> None:
    save_checkpoint({"w": torch.full((2,), -float(step))}, url, step)


def _refused(url: str, step: int, message: str) -> None:
    """A save of ``step`` raises ``message``, and every committed step stays as it was (its
    commit and size; listing, unlike a load, leaves this job's history of the run alone)."""
    before = list_checkpoints(url)
    with pytest.raises(CheckpointExistsError, match=f"^{re.escape(message)}$"):
        _save(url, step)
    assert list_checkpoints(url) == before


def test_a_step_this_job_committed_is_named_as_its_own(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    _save(url, 4)
    _refused(url, 4, f"step 4 is already committed at {url} by this job (an earlier save of step 4 committed it, "
                     "even if that save raised); a committed checkpoint is never overwritten: give each save a new step")


def test_a_step_committed_before_this_job_loaded_is_named_as_such(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    _other_job(tmp_path, url, 1, 2, 3)
    assert load_checkpoint({"w": torch.zeros(2)}, url, 2) == 2  # an older step, on purpose
    _refused(url, 3, f"step 3 is already committed at {url}: it was committed before this job loaded step 2 there "
                     "(the newest committed step then was 3); a committed checkpoint is never overwritten: save steps "
                     "after 3, or save into another URL")


def test_a_step_committed_before_the_first_save_of_a_job_that_loaded_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    _other_job(tmp_path, url, 1, 2)
    _refused(url, 2, f"step 2 is already committed at {url}: it was committed before this job's first save there, "
                     "and this job loaded nothing from this run; a committed checkpoint is never overwritten: to "
                     "continue the run, load_checkpoint first and count steps on from the step it returns; to start "
                     "a new run, save into another URL")


def test_steps_another_job_committed_after_this_job_loaded(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    _other_job(tmp_path, url, 10)
    assert load_checkpoint({"w": torch.zeros(2)}, url) == 10
    _other_job(tmp_path, url, 20, 30)  # the workers of a killed launcher, training on
    _save(url, 15)  # this job's steps go on, the first one unhindered (no step 15 exists)
    _refused(url, 20, TWO_JOBS.format(step=20, url=url, since="this job loaded step 10 there", steps="steps 20, 30"))


def test_a_step_another_job_committed_after_this_job_found_the_run_empty(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    assert load_checkpoint({"w": torch.zeros(2)}, url) is None
    _other_job(tmp_path, url, 5)
    _refused(url, 5, TWO_JOBS.format(step=5, url=url, since="this job found no committed step there", steps="step 5"))


def test_steps_another_job_committed_after_the_first_save_of_a_job_that_loaded_nothing(tmp_path: Path) -> None:
    url = str(tmp_path / "run")
    _other_job(tmp_path, url, 1)
    _save(url, 2)  # this job now holds the writer lease: the other one takes it over
    _other_job(tmp_path, url, *range(3, 13), take_over=True)
    _refused(url, 12, TWO_JOBS.format(step=12, url=url, since="this job's first save there",
                                      steps="steps 3, 4, 5, 6, 7, 8, ..., 12 (10 steps)"))
