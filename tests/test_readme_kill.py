"""Issue 32 point 2: the README's own training script under plain torchrun, `kill -9` of the
launcher mid-epoch, started again at another size. Its words hold: it continues from the
newest committed step, every sample trained once per epoch (the only repeats: the padding
of an epoch's final global step, `even_batches`). Before, the killed launcher's workers
lived on (adopted by init), kept training and committing, and the restart crashed on a step
they had committed, was refused by their writer lease, or found the run finished.

With the opt-out (`DIST_RESUME_END_WITH_LAUNCHER=0`) the orphans train on as before, and the
restarted job's save that finds their step says that two jobs wrote the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_resume import list_checkpoints
from dist_resume.demo.job import wait_until_gone
from tests.readme_script import (AFTER_LAUNCHER_ENV, GO_ENV, PAUSE_AT_ENV, check_every_sample_once_per_epoch,
                                 dataset_size, instrumented, launch, lineage, readme_script, records)

START_TIMEOUT = 300  # seconds for torchrun and its ranks to start and reach a step, under load
BATCH_SIZE = 16  # the README's per-rank batch_size


def _workdir(tmp_path: Path) -> tuple[Path, int]:
    script = readme_script()
    assert "batch_size=16" in script and 'url = "runs/example"' in script and "range(loader.epoch, 3)" in script
    (tmp_path / "train.py").write_text(instrumented(script))
    return tmp_path, dataset_size(script)


def _steps(url: Path) -> list[int]:
    return [info.step for info in list_checkpoints(str(url))]


@pytest.mark.slow
def test_the_readme_script_survives_kill_9_of_torchrun_and_resumes_at_3_then_1(tmp_path: Path) -> None:
    workdir, size = _workdir(tmp_path)
    url = workdir / "runs" / "example"
    # 2 processes (global batch 32, 10 steps an epoch, a save every 10): killed before step 16, in epoch 1
    first = launch(workdir, "first", 2, {PAUSE_AT_ENV: "16", AFTER_LAUNCHER_ENV: "1"})
    workers = first.paused_pids(2, START_TIMEOUT)
    first.kill_launcher()
    wait_until_gone(workers, 60, "outlived their launcher")
    assert _steps(url) == [10]
    # 3 processes (global batch 48, 7 steps an epoch): from step 10, killed before step 23, in epoch 2
    second = launch(workdir, "second", 3, {PAUSE_AT_ENV: "23", AFTER_LAUNCHER_ENV: "1"})
    workers = second.paused_pids(3, START_TIMEOUT)
    second.kill_launcher()
    wait_until_gone(workers, 60, "outlived their launcher")
    assert _steps(url) == [10, 20]
    # 1 process: from step 20, 144 of epoch 2's 320 samples trained, to the end
    third = launch(workdir, "third", 1)
    assert third.wait(START_TIMEOUT) == 0, third.output()

    launches = [records(run.records) for run in (first, second, third)]
    assert [(run[0]["step"], run[-1]["step"]) for run in launches] == [(1, 15), (11, 22), (21, 31)]
    assert {record["world_size"] for run in launches for record in run} == {2, 3, 1} and \
        [sorted({record["world_size"] for record in run}) for run in launches] == [[2], [3], [1]]
    kept = lineage(launches)
    repeats = check_every_sample_once_per_epoch(kept, size, BATCH_SIZE)
    # epoch 1, all at 3 processes, ends on 32 samples: padded to 33, 11 for each rank
    assert repeats == {0: 0, 1: 1, 2: 0}
    assert sorted({record["epoch"] for record in kept}) == [0, 1, 2]
    assert _steps(url) == [10, 20, 30]


@pytest.mark.slow
def test_with_the_opt_out_the_orphans_train_on_and_the_restart_says_two_jobs_wrote_the_run(tmp_path: Path) -> None:
    workdir, _ = _workdir(tmp_path)
    url = workdir / "runs" / "example"
    go_orphans, go_restart = workdir / "go-orphans", workdir / "go-restart"
    opt_out = {"DIST_RESUME_END_WITH_LAUNCHER": "0"}
    first = launch(workdir, "first", 2, {**opt_out, PAUSE_AT_ENV: "16", AFTER_LAUNCHER_ENV: "1",
                                         GO_ENV: str(go_orphans)})
    orphans = first.paused_pids(2, START_TIMEOUT)
    first.kill_launcher()
    restart = launch(workdir, "restart", 3, {**opt_out, PAUSE_AT_ENV: "11", GO_ENV: str(go_restart)})
    try:
        restart.paused_pids(3, START_TIMEOUT)  # it loaded step 10
        go_orphans.write_text("")  # the orphans train on, commit steps 20 and 30, and finish
        wait_until_gone(orphans, START_TIMEOUT, "did not finish")
        assert _steps(url) == [10, 20, 30]
        go_restart.write_text("")
        assert restart.wait(START_TIMEOUT) != 0
    finally:
        go_orphans.write_text("")
        wait_until_gone(orphans, START_TIMEOUT, "did not finish")
    message = ("cannot save step 20 at runs/example: another job committed it. Two jobs wrote this run: since "
               "this job loaded step 10 there, another job committed steps 20, 30. Nothing of this save was "
               "written, and the committed steps are unchanged. Stop the other job (a launcher killed with "
               "kill -9 leaves workers running that do not end with it: see docs/operations.md), then start "
               "this job again: it resumes from the newest committed step")
    errors = [line for line in restart.output().splitlines() if "CheckpointExistsError: " in line]
    # every rank that raised before torchrun stopped the others says the same; rank 0 always does
    assert errors and all(line.endswith(f"CheckpointExistsError: {message}") for line in errors), restart.output()
    assert any(line.startswith("[rank0]: ") for line in errors), restart.output()
    assert _steps(url) == [10, 20, 30]
