"""Several torchrun elastic agents on 127.0.0.1, each one "node" of a single job started by
``launch/elastic.sh`` with its default settings; a node dies as a machine does (its agent
and its workers SIGKILLed at once) and new nodes join."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from dist_resume.demo.job import TrainingJob, free_port, kill_workers

ROOT = Path(__file__).resolve().parents[1]
ELASTIC = ROOT / "launch" / "elastic.sh"
TRAIN = ROOT / "launch" / "train.py"
STARTUP = 120  # seconds for an agent to start under load


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


class ElasticNodes:
    """Nodes of one elastic job (``MIN_NODES``-``MAX_NODES`` of them), each running
    ``launch/elastic.sh launch/train.py ARGS`` with output to ``node<k>.log`` in ``logs``."""

    def __init__(self, logs: Path, train_args: Sequence[str], min_nodes: int, max_nodes: int,
                 env: dict[str, str] | None = None) -> None:
        self.logs = logs
        self.train_args = [str(arg) for arg in train_args]
        self.env = {"MIN_NODES": str(min_nodes), "MAX_NODES": str(max_nodes), "NPROC_PER_NODE": "1",
                    "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "RDZV_ID": "nodes-test", "LOCAL_ADDR": "127.0.0.1",
                    **(env or {})}
        self.nodes: list[TrainingJob] = []

    def __enter__(self) -> ElasticNodes:
        return self

    def __exit__(self, *exc: object) -> None:
        for node in self.nodes:  # whatever failed, no agent or worker outlives the test
            node.__exit__()

    def start(self) -> TrainingJob:
        """One more node: its agent joins the job's next rendezvous round. Under the c10d
        backend the first node's agent hosts the rendezvous store: this returns once it serves."""
        log = self.logs / f"node{len(self.nodes)}.log"
        node = TrainingJob(["bash", str(ELASTIC), str(TRAIN), *self.train_args], log, self.env)
        self.nodes.append(node)
        if len(self.nodes) == 1 and self.env.get("RDZV_BACKEND", "c10d") == "c10d":
            self._wait_until_served(node)
        return node

    def _wait_until_served(self, node: TrainingJob) -> None:
        host, port = self.env["RDZV_ENDPOINT"].rsplit(":", 1)
        deadline = time.monotonic() + STARTUP
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=5).close()
                return
            except OSError:
                if node.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the first agent did not serve the rendezvous store within {STARTUP} s "
                                         f"(exit code {node.process.poll()}):\n{self.log(node)[-3000:]}") from None
                time.sleep(0.1)

    def of_worker(self, pid: int) -> TrainingJob:
        """The node whose agent started the worker ``pid``."""
        agent = parent(pid)
        return next(node for node in self.nodes if node.process.pid == agent)

    def kill(self, node: TrainingJob, worker_pids: Sequence[int]) -> None:
        """SIGKILL ``node``'s agent, then those of ``worker_pids`` that it started, as when
        its machine dies; return once they are gone."""
        agent = node.process.pid
        mine = [pid for pid in worker_pids if parent(pid) == agent]
        assert mine, f"none of the workers {list(worker_pids)} belongs to the agent {agent}"
        os.kill(agent, signal.SIGKILL)
        node.process.wait()
        kill_workers(mine)

    def log(self, node: TrainingJob) -> str:
        return node.log.read_text(errors="replace")
