"""Nodes that leave and join an elastic job (issue 32, point 1): torchrun's elastic agents on
127.0.0.1 as the nodes, ``launch/elastic.sh`` with its default settings (``--nnodes 1:3``, or
``1:2`` where a test needs no third node). A node dies as a machine does (agent and worker
SIGKILLed); new agents join. The records of every run must show each global step trained
once, each sample once per epoch, and global batches and augmentations equal to an
uninterrupted run (G2, G3, G4, G7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_resume.checkpoint.load import list_checkpoints
from dist_resume.demo.job import JobError
from dist_resume.demo.records import read_runs
from dist_resume.demo.verify import verify
from tests.debian_install import reporter
from tests.elastic_nodes import ElasticNodes
from tests.etcd_server import etcd_server

SIZE, SEED, BATCH, EPOCHS = 36, 3, 6, 2  # 6 steps an epoch; the global batch splits over 1, 2 and 3
TIMEOUT = 240  # seconds for one phase: a round with fewer than MAX_NODES nodes waits torchrun's last call (30 s)


def train_args(tmp_path: Path, *pauses: int) -> list[str]:
    args = ["--epochs", EPOCHS, "--dataset-size", SIZE, "--global-batch", BATCH, "--save-every", 2,
            "--seed", SEED, "--checkpoint", tmp_path / "ckpt", "--record", tmp_path / "records"]
    if pauses:
        args += ["--pause-file", tmp_path / "pause-{step}.json"]
    for step in pauses:
        args += ["--pause-at-step", step]
    return [str(arg) for arg in args]


def pause_file(tmp_path: Path, step: int) -> Path:
    return tmp_path / f"pause-{step}.json"


def resume(tmp_path: Path, step: int) -> None:
    """Let the job paused at ``step`` train on."""
    (tmp_path / f"pause-{step}.json.resume").write_text("")


def assert_exact(tmp_path: Path, world_sizes: list[int], resumed_from: list[int]) -> None:
    runs = read_runs(tmp_path / "records")
    assert [(run.world_size, run.resumed_from) for run in runs] == list(zip(world_sizes, resumed_from))
    verdict = verify(tmp_path / "records", SIZE, SEED, BATCH, EPOCHS)
    assert [(check.name, check.passed) for check in verdict.checks] == [
        ("steps: no step lost or repeated", True),
        ("G2 every sample exactly once per epoch", True),
        ("G3 global batches equal the reference", True),
        ("G4 augmentations equal the reference", True),
    ], [check.detail for check in verdict.checks]
    assert [info.step for info in list_checkpoints(str(tmp_path / "ckpt"))] == [2, 4, 6, 8, 10, 12]


@pytest.mark.slow
def test_nodes_leave_and_join_two_one_two_three_one(tmp_path: Path) -> None:
    """2 -> 1 -> 2 -> 3 -> 1 nodes, one job (both sequences of issue 32 in one run, each round
    with fewer than MAX_NODES nodes costing torchrun's 30 s last call). Node B dies at step 3
    and A trains on alone from step 2; node C joins at step 5 and A and C resume from step 4;
    node D joins at step 7 and the three resume from step 6; C and D die at step 9, and A
    trains on alone from step 8 to the end. A hosts the c10d rendezvous and stays."""
    with ElasticNodes(tmp_path, train_args(tmp_path, 3, 5, 7, 9), min_nodes=1, max_nodes=3) as nodes:
        a = nodes.start()
        b = nodes.start()
        pids = a.wait_for_pause(pause_file(tmp_path, 3), TIMEOUT)
        nodes.kill(b, pids)
        resume(tmp_path, 3)  # A's worker meets its dead peer in the next collective
        a.wait_for_pause(pause_file(tmp_path, 5), TIMEOUT)
        c = nodes.start()  # A's agent sees a node waiting and restarts its worker
        a.wait_for_pause(pause_file(tmp_path, 7), TIMEOUT)
        d = nodes.start()
        pids = a.wait_for_pause(pause_file(tmp_path, 9), TIMEOUT)
        nodes.kill(c, pids)
        nodes.kill(d, pids)
        resume(tmp_path, 9)
        a.wait(TIMEOUT)
    assert_exact(tmp_path, [2, 1, 2, 3, 1], [0, 2, 4, 6, 8])


@pytest.mark.slow
def test_the_c10d_rendezvous_host_takes_the_job_with_it_and_a_new_launch_resumes(tmp_path: Path) -> None:
    """Under the c10d backend the rendezvous store lives in the first node's agent: when that
    node dies, the other nodes cannot rendezvous again and fail. The committed steps survive:
    a new launch resumes from the last one, exactly."""
    with ElasticNodes(tmp_path, train_args(tmp_path, 3), min_nodes=1, max_nodes=2) as nodes:
        host = nodes.start()
        other = nodes.start()
        pids = other.wait_for_pause(pause_file(tmp_path, 3), TIMEOUT)
        nodes.kill(host, pids)
        resume(tmp_path, 3)
        with pytest.raises(JobError, match="exited with code 1"):
            other.wait(TIMEOUT)
        assert "RendezvousConnectionError: The connection to the C10d store has failed" in nodes.log(other)
    (tmp_path / "relaunch").mkdir()
    with ElasticNodes(tmp_path / "relaunch", train_args(tmp_path), min_nodes=1, max_nodes=1) as relaunch:
        relaunch.start().wait(TIMEOUT)
    assert_exact(tmp_path, [2, 1], [0, 2])


@pytest.mark.slow
def test_an_etcd_rendezvous_outlives_any_node(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Under the etcd-v2 backend the rendezvous lives in etcd, outside the nodes: the node of
    rank 0 (its agent was the rendezvous' rank 0, its worker hosted the workers' store) dies
    at step 3, and the other node trains on alone from step 2."""
    with etcd_server(tmp_path / "etcd", reporter(request)) as endpoint, \
            ElasticNodes(tmp_path, train_args(tmp_path, 3), min_nodes=1, max_nodes=2,
                         env={"RDZV_BACKEND": "etcd-v2", "RDZV_ENDPOINT": endpoint}) as nodes:
        nodes.start()
        nodes.start()
        pids = nodes.nodes[0].wait_for_pause(pause_file(tmp_path, 3), TIMEOUT)
        first = nodes.of_worker(pids[0])
        survivor = next(node for node in nodes.nodes if node is not first)
        nodes.kill(first, pids)
        resume(tmp_path, 3)
        survivor.wait(TIMEOUT)
    assert_exact(tmp_path, [2, 1], [0, 2])
