"""torchft for real: a lighthouse (the wheel's ``torchft_lighthouse``) on a free loopback port
and replica groups of one process each (gloo), killed with SIGKILL in the middle of a step,
restarted, joining late, killed during the live hand-off of their state. The records of
every step (dist_resume.demo.torchft_group) are counted against the epoch's order:
exactly once over committed steps (G2), in the epoch's order, with each sample's own
augmentation (G4). Nothing here is timed: holds and releases pace the groups."""

from __future__ import annotations

import contextlib
import re
import signal
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from dist_resume import ManagedLoader, ResumableDataLoader
from dist_resume.cli import main
from dist_resume.demo.torchft_job import TorchftJob
from dist_resume.demo.torchft_verify import Tally, read_lines, tally

pytest.importorskip("torchft", reason="torchft is not installed (pip install -e '.[test]' installs it)")

SIZE = 40  # 10 steps of 2 groups x 2 samples per epoch
COMMON = ["--dataset-size", str(SIZE), "--batch-size", "2"]
KILLED = -signal.SIGKILL


def _counted(directory: Path, epochs: int = 1, lines: list | None = None) -> Tally:
    return tally(read_lines(directory / "records") if lines is None else lines, SIZE, 0, epochs)


def _issue_scenario(workdir: Path, *options: str) -> Tally:
    """The issue's scenario: 2 groups of one process, batch 2; g1 is SIGKILLed in the middle
    of step 3 and restarted once g0 committed 3 steps alone."""
    with TorchftJob(workdir, [*COMMON, *options]) as job:
        g0 = job.start("g0", "--hold-at-step", "6")
        g1 = job.start("g1", "--kill-at-step", "3")
        job.go(g0, g1)
        assert g1.exited() == KILLED
        g1, = job.join_at(6, [g0], "g1")
        g0.finished()
        g1.finished()
    return _counted(workdir)


@pytest.mark.slow
def test_torchfts_own_sampler_loses_and_repeats_samples_in_the_issues_scenario(tmp_path):
    """Reproduces the issue: with torchft.data.DistributedSampler, the healthy group's
    uncommitted step is never trained again (its loader moved on) and the restarted group
    trains its shard again from its start."""
    counted = _issue_scenario(tmp_path, "--data", "torchft-sampler")
    print(f"torchft's sampler: {counted.lost} lost, {counted.repeated} repeated, {counted.wasted} wasted batches")
    assert counted.lost >= 2  # g0's step 3
    assert counted.repeated >= 6  # g1's first 3 batches, trained before the kill and again after it


@pytest.mark.slow
@pytest.mark.parametrize(("options", "trains_from", "wasted"),
                         [((), 6, 1), (("--async-quorum", "--num-workers", "2"), 7, 2)], ids=["sync", "async-2-workers"])
def test_a_group_killed_mid_step_and_restarted_loses_and_repeats_nothing(tmp_path, options, trains_from, wasted):
    """The issue's scenario through ManagedLoader: 0 lost, 0 repeated. The step cut by the kill
    did not commit and its positions were served again; g1 comes back in step 6's quorum. With
    the synchronous quorum it heals before that step and trains in it; with the asynchronous
    one its healing step 6 was handed data it did not count, and its workers' prefetched
    batches were dropped at every change of quorum."""
    counted = _issue_scenario(tmp_path, *options)
    print(f"ManagedLoader: {counted.lost} lost, {counted.repeated} repeated, {counted.wasted} wasted batches")
    assert (counted.lost, counted.repeated, counted.augmentation_mismatches) == (0, 0, 0)
    assert counted.exact, counted.epochs
    assert counted.wasted == wasted  # g0's step cut by the kill; with async, g1's healing step
    lines = read_lines(tmp_path / "records")
    restarted = [line for line in lines if line["replica"] == "g1" and line["event"] == "step" and line["step"] >= 6]
    assert min(line["step"] for line in restarted) == 6
    assert min(line["step"] for line in restarted if line["taking_part"] and line["committed"]) == trains_from


@pytest.mark.slow
def test_groups_of_two_ranks_one_killed_mid_step_and_restarted_lose_and_repeat_nothing(tmp_path):
    """2 replica groups of 2 processes each (each rank its own Manager and its own shard of the
    group's part, gradients averaged inside the group with gloo): both ranks of g1 are SIGKILLed
    in the middle of step 3; g0 commits steps 3-5 alone; g1 comes back at step 6, each rank
    healed from g0's rank of the same group rank. 80 samples, 8 per step of 2 groups."""
    size = 80
    with TorchftJob(tmp_path, ["--dataset-size", str(size), "--batch-size", "2"]) as job:
        g0 = job.start("g0", "--hold-at-step", "6", ranks=2)
        g1 = job.start("g1", "--kill-at-step", "3", ranks=2)
        job.go(g0, g1)
        assert g1.exited() == KILLED
        g1, = job.join_at(6, [g0], "g1", ranks=2)
        g0.finished()
        g1.finished()
    lines = read_lines(tmp_path / "records")
    counted = tally(lines, size, 0, 1)
    assert (counted.lost, counted.repeated, counted.augmentation_mismatches) == (0, 0, 0)
    assert counted.exact, counted.epochs
    steps = [line for line in lines if line["event"] == "step"]
    assert {(line["group_rank"], line["group_size"]) for line in steps} == {(0, 2), (1, 2)}
    cut = [line for line in steps if line["step"] == 3 and not line["committed"]]
    assert sorted((line["replica"], line["group_rank"]) for line in cut) == [("g0", 0), ("g0", 1)]
    back = [line for line in steps if line["replica"] == "g1" and line["step"] >= 6]
    assert {line["group_rank"] for line in back if line["taking_part"] and line["committed"]} == {0, 1}
    assert min(line["step"] for line in back if line["taking_part"] and line["committed"]) == 6
    assert {line["step"] for line in steps if line["committed"] and line["participants"] == 1} == {3, 4, 5}


@pytest.mark.slow
def test_a_group_killed_for_good_leaves_its_positions_to_the_others(tmp_path):
    with TorchftJob(tmp_path, COMMON) as job:
        g0 = job.start("g0")
        g1 = job.start("g1", "--kill-at-step", "3")
        job.go(g0, g1)
        assert g1.exited() == KILLED
        g0.finished()
    counted = _counted(tmp_path)
    assert counted.exact, counted.epochs
    alone = [line for line in read_lines(tmp_path / "records") if line.get("participants") == 1 and line["committed"]]
    assert alone and all(line["replica"] == "g0" for line in alone)


@pytest.mark.slow
def test_a_group_that_joins_late_takes_its_part_from_its_first_step(tmp_path):
    with TorchftJob(tmp_path, COMMON) as job:
        g0 = job.start("g0", "--hold-at-step", "4")
        g1 = job.start("g1", "--hold-at-step", "4")
        job.go(g0, g1)
        g2, = job.join_at(4, [g0, g1], "g2")
        for group in (g0, g1, g2):
            group.finished()
    counted = _counted(tmp_path)
    assert counted.exact, counted.epochs
    late = [line for line in read_lines(tmp_path / "records") if line["replica"] == "g2" and line["event"] == "step"]
    assert any(line["participants"] == 3 and line["taking_part"] and line["committed"] for line in late)


@pytest.mark.slow
def test_two_groups_killed_at_once_and_restarted(tmp_path):
    with TorchftJob(tmp_path, COMMON) as job:
        g0 = job.start("g0", "--hold-at-step", "6")
        g1 = job.start("g1", "--kill-at-step", "3")
        g2 = job.start("g2", "--kill-at-step", "3")
        job.go(g0, g1, g2)
        assert (g1.exited(), g2.exited()) == (KILLED, KILLED)
        restarted = job.join_at(6, [g0], "g1", "g2")
        for group in (g0, *restarted):
            group.finished()
    counted = _counted(tmp_path)
    assert counted.exact, counted.epochs


@pytest.mark.slow
def test_a_kill_during_the_live_hand_off(tmp_path):
    """g2 dies and comes back; the group handing it the state (g0, the first up-to-date one)
    is SIGKILLed while its Manager reads that state: the hand-off fails, the step does not
    commit, and g2 heals from g1 at the next step."""
    with TorchftJob(tmp_path, COMMON) as job:
        g0 = job.start("g0", "--hold-at-step", "6", "--kill-on-hand-off", "4")
        g1 = job.start("g1", "--hold-at-step", "6")
        g2 = job.start("g2", "--kill-at-step", "3")
        job.go(g0, g1, g2)
        assert g2.exited() == KILLED
        g2, = job.join_at(6, [g0, g1], "g2")
        assert g0.exited() == KILLED
        g1.finished()
        g2.finished()
    counted = _counted(tmp_path)
    assert counted.exact, counted.epochs
    healed = [line for line in read_lines(tmp_path / "records") if line["replica"] == "g2" and line.get("step", 0) >= 6]
    assert any(line["taking_part"] and line["committed"] for line in healed)


@pytest.mark.slow
def test_torchft_ddp_fails_in_the_healthy_group_where_the_manual_allreduce_survives(tmp_path):
    """What docs/frameworks-torchft.md recommends, and why: torchft 0.2.0's
    DistributedDataParallel raises in the healthy group when its peer dies mid-step (its
    communication hook asserts a future that the failed allreduce never set), where the
    per-gradient manager.allreduce of allreduce_gradients lets it go on alone
    (test_a_group_killed_for_good_leaves_its_positions_to_the_others)."""
    with TorchftJob(tmp_path, [*COMMON, "--gradients", "ddp"]) as job:
        g0 = job.start("g0")
        g1 = job.start("g1", "--kill-at-step", "3")
        job.go(g0, g1)
        assert g1.exited() == KILLED
        assert g0.exited() != 0
        log = g0.log.read_text()
    assert "AssertionError" in log and "assert fut._fut" in log


@pytest.mark.slow
def test_a_full_restart_from_a_checkpoint_at_another_number_of_groups_resumes_exactly(tmp_path):
    """save_checkpoint beside torchft (the same plan as a restart): 2 groups train into the
    second epoch, g0 saving every 4 steps, and the whole job is killed at step 14; 3 groups
    restart from the checkpoint of step 12 (steps 12 and 13 are rolled back)."""
    checkpoint = str(tmp_path / "checkpoint")
    two = ["--epochs", "2"]
    with TorchftJob(tmp_path / "first", [*COMMON, *two]) as job:
        g0 = job.start("g0", "--hold-at-step", "14", "--checkpoint", checkpoint, "--save-every", "4")
        g1 = job.start("g1", "--hold-at-step", "14")
        job.go(g0, g1)
        g0.held(14)
        g1.held(14)
    with TorchftJob(tmp_path / "second", [*COMMON, *two, "--resume", checkpoint]) as job:
        groups = [job.start(f"g{number}") for number in range(3)]
        job.go(*groups)
        for group in groups:
            group.finished()
    first = [line for line in read_lines(tmp_path / "first" / "records") if line.get("step", 0) < 12]
    second = read_lines(tmp_path / "second" / "records")
    assert 3 in {line["participants"] for line in second if line["event"] == "step"}
    assert min(line["step"] for line in second if line["event"] == "step") == 12
    counted = _counted(tmp_path, 2, first + second)
    assert counted.exact, counted.epochs


@pytest.mark.slow
def test_the_demo_kills_restarts_leaves_and_joins_and_verifies(tmp_path, capsys):
    """`dist-resume demo --torchft`: 3 groups; g1 killed mid-step and restarted, g2 killed for
    good, g3 joining; each sample exactly once per epoch, in order, same augmentations."""
    code = main(["demo", "--torchft", "--workdir", str(tmp_path / "demo"), "--dataset-size", "72"])
    out = capsys.readouterr().out
    assert code == 0, out
    lives = [line.split()[:3] + [" ".join(line.split()[4:])] for line in out.splitlines() if re.match(r"g\d ", line)]
    assert [(life[0], life[1], life[3]) for life in lives] == [
        ("g0", "1", "finished"), ("g1", "1", "killed in step 3"), ("g1", "2", "finished"),
        ("g2", "1", "killed in step 8"), ("g3", "1", "finished")]
    for line in ("PASS  each sample exactly once per epoch over committed steps (G2)",
                 "PASS  committed steps read each epoch's order from its start",
                 "PASS  every serving of a sample has its uninterrupted augmentation (G4)", "verdict: PASS"):
        assert line in out.splitlines()


@pytest.mark.parametrize("options, exit_code, message", [
    (["--global-batch", "12"], 2, "--global-batch does not apply to --torchft (its groups read no checkpoint)"),
    (["--checkpoint", "x", "--save-every", "3"], 2, "--checkpoint and --save-every do not apply to --torchft"),
    (["--dataset-size", "60"], 1, "--dataset-size 60 gives 10 steps of 3 groups per epoch; the demo's events need "
                                  "more than 11: use at least 72"),
])
def test_the_demo_refuses_options_it_cannot_run_with(tmp_path, capsys, options, exit_code, message):
    code = main(["demo", "--torchft", "--workdir", str(tmp_path / "demo"), *options])
    err = capsys.readouterr().err
    assert code == exit_code and message in err and err.count("\n") == 1
    assert not (tmp_path / "demo").exists()


@pytest.fixture
def lone_manager():
    """Managers of a lone replica group (this process) under a lighthouse of this process."""
    from torch.distributed import TCPStore
    from torchft import Manager, ProcessGroupGloo
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
    made = []

    def make(**options):
        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        settings = {"use_async_quorum": False, "timeout": timedelta(seconds=60), **options}
        manager = Manager(pg=ProcessGroupGloo(), min_replica_size=1, load_state_dict=None, state_dict=None,
                          replica_id=f"lone{len(made)}", lighthouse_addr=lighthouse.address(), hostname="127.0.0.1",
                          store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1, **settings)
        made.append((manager, store))
        return manager

    yield make
    for manager, _ in made:
        manager.shutdown(wait=False)
    lighthouse.shutdown()


def _loader(**options) -> ResumableDataLoader:
    return ResumableDataLoader(list(range(12)), batch_size=2, shuffle=False, seed=0, rank=0, world_size=1, **options)


def test_a_quorum_started_during_a_step_is_refused_before_the_step_trains(lone_manager):
    """torchft's OptimizerWrapper.zero_grad starts a quorum: inside a ManagedLoader's step it
    would run the step under groups its batch was not cut for."""
    from torchft.optim import OptimizerWrapper

    manager = lone_manager()
    model = torch.nn.Linear(1, 1)
    optimizer = OptimizerWrapper(manager, torch.optim.SGD(model.parameters(), lr=0.1))
    managed = ManagedLoader(_loader(), manager)
    batches = iter(managed)
    assert next(batches).tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="manager.start_quorum\\(\\) was called during a step that ManagedLoader "
                                           "started"):
        optimizer.zero_grad()
    assert manager.should_commit()
    assert next(batches).tolist() == [2, 3]  # the step committed; the next one goes on from it


def test_a_step_that_does_not_commit_is_served_again(lone_manager):
    manager = lone_manager()
    managed = ManagedLoader(_loader(), manager)
    batches = iter(managed)
    served = [next(batches).tolist()]
    manager.report_error(RuntimeError("a peer died"))  # as a failed allreduce does
    assert not manager.should_commit()
    served.append(next(batches).tolist())
    assert manager.should_commit()
    served.append(next(batches).tolist())
    assert served == [[0, 1], [0, 1], [2, 3]]
    state = managed.state_dict()  # mid-step: the served step is not in it
    assert state["plan"].tolist() == [0, 1, 2, 0, 0]


@pytest.mark.parametrize("make, options, error, message", [
    (lambda: _loader(), {"use_async_quorum": True}, ValueError,
     "use_async_quorum=True and init_sync=True counts the groups it heals at step 0 as participants"),
    (lambda: _loader(drop_last=True), {}, ValueError, "needs drop_last=False, even_batches=True"),
    (lambda: ResumableDataLoader(list(range(12)), batch_size=2, rank=0, world_size=1), {}, ValueError,
     "this loader has a seed drawn in this process"),
])
def test_what_it_cannot_serve_exactly_is_refused(lone_manager, make, options, error, message):
    with pytest.raises(error, match=re.escape(message)):
        ManagedLoader(make(), lone_manager(**options))


def test_only_a_resumable_loader_and_a_torchft_manager_are_taken(lone_manager):
    with pytest.raises(TypeError, match="ManagedLoader expects a ResumableDataLoader, got DataLoader"):
        ManagedLoader(torch.utils.data.DataLoader(list(range(4))), lone_manager())
    with pytest.raises(TypeError, match="ManagedLoader expects a torchft.Manager, got object"):
        ManagedLoader(_loader(), object())


_MOVED = ("the loader was moved outside ManagedLoader (set_epoch(), skip(), load_state_dict(), regroup() or iter() on "
          "the loader itself): its position must follow the committed steps only. Iterate `while managed.epoch < "
          "epochs: for batch in managed` without set_epoch(), and load a state with managed.load_state_dict()")


@pytest.mark.parametrize("steps_before", [6, 2], ids=["between-epochs", "mid-epoch"])
def test_an_epoch_set_on_the_loader_behind_the_managers_back_is_refused(lone_manager, steps_before):
    """A loop that keeps its own epoch counter (`loader.set_epoch(epoch)`) would, in a group
    that healed into its peers' later epoch, serve another epoch than its peers in the same
    steps. Between epochs the loader silently served the epoch set; mid-epoch its stale pass
    said to call iter(loader)."""
    manager = lone_manager()
    loader = _loader()
    managed = ManagedLoader(loader, manager)
    batches = iter(managed)
    for _ in range(steps_before):
        next(batches)
        assert manager.should_commit()
    with pytest.warns(UserWarning) if steps_before < 6 else contextlib.nullcontext():
        loader.set_epoch(5)
    with pytest.raises(RuntimeError, match=re.escape(_MOVED)):
        next(batches) if steps_before < 6 else next(iter(managed))
