"""Ranks that name different checkpoint locations (issue 11 point 3) or pass different
arguments (issue 24 point 1) fail together and commit nothing (G7). Real 2-process gloo jobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dist_resume import list_checkpoints, save_checkpoint
from tests import rank_agreement_worker
from tests.checkpoint_worker import run
from tests.s3_server import free_port


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_ranks_with_different_urls_fail_together_and_commit_nothing(tmp_path: Path, async_save: bool) -> None:
    root = tmp_path / "nodes"
    for rank in (0, 1):
        (root / f"cwd{rank}").mkdir(parents=True)
        # a committed step in each rank's own place, so that a load has something to mix
        save_checkpoint({"w": torch.full((2,), 9.0)}, str(root / f"rank{rank}"), 1)
    out = tmp_path / "out"
    run("per_rank_urls", 2, {"out": str(out), "root": str(root), "async_save": async_save},
        free_port(), script=rank_agreement_worker.__file__)

    def errors(scenario: str) -> set[str]:
        return {(out / f"{scenario}-error-{rank}.txt").read_text() for rank in (0, 1)}

    advice = "every rank must pass the same URL, on storage that every rank can reach"
    places = f"ranks [0]: {root}/rank0; ranks [1]: {root}/rank1"
    assert errors("save") == {f"CheckpointError: cannot save step 5: the ranks do not name the same "
                              f"checkpoint location ({places}); {advice}"}
    assert errors("load") == {f"CheckpointError: cannot load a checkpoint: the ranks do not name the same "
                              f"checkpoint location ({places}); {advice}"}
    relative = f"ranks [0]: {root}/cwd0/run; ranks [1]: {root}/cwd1/run"
    assert errors("relative") == {f"CheckpointError: cannot save step 5: the ranks do not name the same "
                                  f"checkpoint location ({relative}); {advice}"}
    # nothing was written for step 5 anywhere
    assert sorted(p.name for p in (root / "rank0").iterdir()) == [".commits", ".writer_lease_0", "step_00000001"]
    assert sorted(p.name for p in (root / "rank1").iterdir()) == [".commits", ".writer_lease_0", "step_00000001"]
    assert not (root / "cwd0" / "run").exists() and not (root / "cwd1" / "run").exists()


@pytest.mark.slow
def test_node_local_storage_behind_one_url_commits_nothing(tmp_path: Path) -> None:
    """The same URL on every rank, storage of its own on each (a node-local /tmp): rank 0
    used to commit a step without rank 1's shard. Now every rank fails, nothing is committed."""
    out = tmp_path / "out"
    run("node_local_storage", 2, {"out": str(out)}, free_port(), script=rank_agreement_worker.__file__)
    errors = {(out / f"node_local-error-{rank}.txt").read_text() for rank in (0, 1)}
    assert len(errors) == 1
    (error,) = errors
    assert error.startswith("CheckpointError: step 5 at memory://run not committed: rank 0 cannot read every "
                            "rank's files (step 5 at memory://run is damaged: shard __1_0.distcp is missing); "
                            "the URL must name storage that every rank shares"), error
    assert [(out / f"node_local-committed-{rank}.txt").read_text() for rank in (0, 1)] == ["[]", "[]"]


@pytest.mark.slow
def test_ranks_with_different_arguments_fail_together_and_write_nothing(tmp_path: Path) -> None:
    """Ranks passing steps 5 and 6 both returned success and only rank 0's step was committed;
    disagreeing async_save flags hung. Now each call is one error, the same on every rank,
    naming the argument and each rank's value, and nothing is written or loaded."""
    url = tmp_path / "run"
    for step in (1, 2):
        save_checkpoint({"w": torch.full((2,), float(step))}, str(url), step)
    out = tmp_path / "out"
    run("disagreeing_arguments", 2, {"out": str(out), "url": str(url)}, free_port(),
        script=rank_agreement_worker.__file__)

    def error(scenario: str) -> str:
        (only,) = {(out / f"{scenario}-error-{rank}.txt").read_text() for rank in (0, 1)}
        return only

    assert error("step") == ("CheckpointError: cannot save a checkpoint: the ranks do not pass the same step "
                             "(ranks [0]: 5; ranks [1]: 6); every rank must pass the same step, keep and async_save")
    assert error("keep") == ("CheckpointError: cannot save step 5: the ranks do not pass the same keep "
                             "(ranks [0]: 1; ranks [1]: 2); every rank must pass the same step, keep and async_save")
    assert error("async") == ("CheckpointError: cannot save step 5: the ranks do not pass the same async_save "
                              "(ranks [0]: True; ranks [1]: False); every rank must pass the same step, keep and "
                              "async_save")
    assert error("several") == ("CheckpointError: cannot save a checkpoint: the ranks do not pass the same step "
                                "(ranks [0]: 5; ranks [1]: 6) nor the same keep (ranks [0]: 2; ranks [1]: None); "
                                "every rank must pass the same step, keep and async_save")
    assert error("load_step") == ("CheckpointError: cannot load a checkpoint: the ranks do not pass the same step "
                                  "(ranks [0]: 1; ranks [1]: 2); every rank must pass the same step")
    assert sorted(p.name for p in url.iterdir()) == [".commits", ".writer_lease_0", "step_00000001", "step_00000002"]
    assert [(out / f"loaded-{rank}.txt").read_text() for rank in (0, 1)] == ["[0.0, 0.0]", "[1.0, 1.0]"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exits", "raises", "stalls"])
@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_whose_peer_is_gone_fails_within_the_group_timeout(tmp_path: Path, how: str, async_save: bool) -> None:
    """The job's group timeout is 10 s; the launcher's timeout of 90 s is the check that no
    rank waits for torch's 30-minute default (issue 24, point 2). Rank 0 gets one
    CheckpointError that says a peer is gone, and nothing is committed."""
    url, out = tmp_path / "run", tmp_path / "out"
    run("peer_gone", 2, {"out": str(out), "url": str(url), "how": how, "async_save": async_save}, free_port(),
        script=rank_agreement_worker.__file__, timeout=90)
    error = (out / "peer_gone-error-0.txt").read_text()
    assert error.startswith(f"CheckpointError: cannot save step 5 at {url}, which is not committed: a peer rank is "
                            "gone or did not take part within the process group's timeout (10 s) ("), error
    assert not url.exists() or list_checkpoints(str(url)) == []


@pytest.mark.slow
def test_a_loader_field_refused_on_one_rank_fails_every_rank_in_the_agreement(tmp_path: Path) -> None:
    """Rank 1's loader state holds an undeclared field. The refusal used to come after the
    ranks' agreement, on rank 1 alone, and rank 0 waited in the next collective for the
    group timeout (60 s; the launcher's 40 s ends the test then). Now the refusal is part of
    the agreement: both ranks raise it at once, and nothing is written."""
    url, out = tmp_path / "run", tmp_path / "out"
    run("undeclared_field", 2, {"out": str(out), "url": str(url)}, free_port(),
        script=rank_agreement_worker.__file__, timeout=40)
    errors = {(out / f"undeclared-error-{rank}.txt").read_text() for rank in (0, 1)}
    assert errors == {
        "CheckpointError: cannot save step 5: rank 1: data loader field 'loader.rank_1.undeclared' "
        "is declared neither shared by every rank's load nor read by its own rank only "
        "(dist_resume.checkpoint.entry_fields), so a load at another world size would lose it; this is a "
        "dist_resume bug, please report it"}
    assert not url.exists() or list_checkpoints(str(url)) == []
