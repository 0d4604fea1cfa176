"""Exactly one writer wins any race for a run's writer lease, whatever the interleaving
(issue 33): jobs taking the lease run as threads, one at a time, and hypothesis picks which
one makes its next store request; time passes only while all of them wait (a discrete-event
simulation in which each job's heartbeat is on time, and a listing may miss any name
created while it was being read). The store under them is a real local folder."""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_resume.checkpoint import lease
from dist_resume.checkpoint.lease_files import successor
from dist_resume.checkpoint.lease_holder import Holder
from dist_resume.errors import CheckpointError
from dist_resume.storage import CheckpointStore, Entry, open_store, resolve
from tests.lease_records import record, refused

REFRESH = 20.0  # seconds of simulated time between a holder's heartbeats
START = 1000.0


class Over(Exception):
    """Every job has decided: the simulation ends its holders' heartbeats."""


class Simulation:
    """The jobs' threads, run one at a time by the main thread."""

    def __init__(self, schedule: random.Random, jobs: int) -> None:
        self.schedule = schedule
        self.jobs = jobs
        self.clock = START
        self.ready: dict[int, int] = {}  # job -> the answer it will get (random bits) when picked
        self.sleeping: dict[int, float] = {}  # job -> when it wakes
        self.done: set[int] = set()  # jobs whose thread ended
        self.decided: set[int] = set()  # jobs that took the lease or were refused
        self.turn: int | None = None
        self.over = False
        self.steps = 0
        self.cond = threading.Condition()
        self.who = threading.local()

    # -- called by a job's thread
    def _park(self) -> None:
        self.turn = None
        self.cond.notify_all()
        self.cond.wait_for(lambda: self.turn == self.who.job)
        if self.over:
            raise Over

    def step(self) -> int:
        with self.cond:
            self.ready[self.who.job] = 0
            self._park()
            return self.ready.pop(self.who.job)

    def sleep(self, seconds: float) -> None:
        with self.cond:
            self.sleeping[self.who.job] = self.clock + seconds
            self._park()

    def finish(self, decided: bool) -> None:
        with self.cond:
            if decided:
                self.decided.add(self.who.job)
            self.done.add(self.who.job)
            self.turn = None
            self.cond.notify_all()

    def decide(self) -> None:
        with self.cond:
            self.decided.add(self.who.job)

    # -- the main thread
    def run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.turn is None and len(self.ready) + len(self.sleeping)
                                   + len(self.done) == self.jobs, timeout=60)
                assert self.turn is None, "a job blocked outside the simulation"
                if len(self.decided) == self.jobs:
                    self.over = True
                    waiting = sorted(set(self.ready) | set(self.sleeping))
                    self.ready.clear()
                    self.sleeping.clear()
                    for job in waiting:  # each raises Over and ends
                        self.turn = job
                        self.cond.notify_all()
                        self.cond.wait_for(lambda: self.turn is None, timeout=60)
                    return
                self.steps += 1
                assert self.steps < 20000, "the race never ended"
                if not self.ready:
                    self.clock = min(self.sleeping.values())
                    for job in [job for job, wake in self.sleeping.items() if wake == self.clock]:
                        del self.sleeping[job]
                        self.ready[job] = 0
                job = self.schedule.choice(sorted(self.ready))
                self.ready[job] = self.schedule.getrandbits(32)
                self.turn = job
                self.cond.notify_all()


class ScheduledStore(CheckpointStore):
    """A real store whose every request is a step of the simulation; a listing is two steps,
    and keeps any name created between them or not, as the schedule says."""

    def __init__(self, real: CheckpointStore, simulation: Simulation) -> None:
        super().__init__(real.loc)
        self.real = real
        self.simulation = simulation

    def entries(self, path: str) -> list[Entry]:
        self.simulation.step()
        first = set(self.real.entries(path))
        keep = random.Random(self.simulation.step())
        return [entry for entry in self.real.entries(path) if entry in first or keep.random() < 0.5]

    def _then(self, method: str, *args: Any) -> Any:
        self.simulation.step()
        return getattr(self.real, method)(*args)

    def kind(self, path: str, follow_links: bool = False) -> str | None:
        return self._then("kind", path, follow_links)

    def exists(self, path: str) -> bool:
        return self._then("exists", path)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        return self._then("create_exclusive", path, data)

    def overwrite(self, path: str, data: bytes) -> None:
        return self._then("overwrite", path, data)

    def remove_tree(self, path: str) -> None:
        return self._then("remove_tree", path)

    def remove_file(self, path: str) -> None:
        return self._then("remove_file", path)

    def tree_size(self, path: str) -> int:
        return self._then("tree_size", path)

    def ensure_directory(self, path: str) -> None:
        self.real.ensure_directory(path)


class SimulatedTime:
    """`time` as the lease module sees it: the simulation's clock for how long a job waits;
    the wall clock stays this machine's, as the holders' records read it."""

    def __init__(self, simulation: Simulation) -> None:
        self.simulation = simulation

    def monotonic(self) -> float:
        return self.simulation.clock

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.simulation.sleep(seconds)


def _start(url: str, start: str) -> None:
    """What the run holds before the race."""
    path = Path(url, ".writer_lease_0")
    if start == "none":
        return
    if start == "nameless":
        path.write_text("not a record")
    elif start == "released":
        path.write_bytes(record(time.time(), refresh=REFRESH, released=True))
    elif start == "gone":  # a process of this machine that is gone: started at another time
        mine = Holder.this_process(REFRESH)
        path.write_bytes(record(time.time(), refresh=REFRESH, host=mine.host, pid=mine.pid,
                                process=mine.process.rpartition("@")[0] + "@0"))
    else:  # "silent", "forced": a job on another machine whose heartbeat stopped
        path.write_bytes(record(time.time(), refresh=REFRESH))


def _job(simulation: Simulation, number: int, store: CheckpointStore, outcomes: dict[int, Any]) -> None:
    simulation.who.job = number
    try:
        try:
            held = lease.take(ScheduledStore(store, simulation))
        except CheckpointError as error:
            outcomes[number] = str(error)
            simulation.finish(decided=True)
            return
        except Exception as error:  # noqa: BLE001 - reported by the test, not lost in a thread
            outcomes[number] = error
            simulation.finish(decided=True)
            return
        outcomes[number] = held
        held.stop()  # its heartbeat runs in the simulation instead
        simulation.decide()
        while True:
            simulation.sleep(held.holder.refresh_seconds)
            if not held.heartbeat():
                break
        simulation.finish(decided=False)  # decided already
    except Over:
        simulation.finish(decided=False)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.sampled_from(["none", "nameless", "released", "gone", "silent", "forced"]),
       jobs=st.integers(2, 5), schedule=st.randoms(use_true_random=False))
def test_exactly_one_job_holds_the_lease_after_any_interleaving(tmp_path_factory: pytest.TempPathFactory,
                                                               start: str, jobs: int,
                                                               schedule: random.Random) -> None:
    url = str(tmp_path_factory.mktemp("run"))
    _start(url, start)
    store = open_store(resolve(url))
    simulation = Simulation(schedule, jobs)
    outcomes: dict[int, Any] = {}
    environment = {"DIST_RESUME_LEASE_REFRESH": str(REFRESH), "DIST_RESUME_TAKE_OVER": "1" if start == "forced" else ""}
    with mock.patch.dict("os.environ", environment), mock.patch.object(lease, "time", SimulatedTime(simulation)):
        threads = [threading.Thread(target=_job, args=(simulation, n, store, outcomes), daemon=True)
                   for n in range(jobs)]
        for thread in threads:
            thread.start()
        simulation.run()
        for thread in threads:
            thread.join(timeout=60)
    assert not [outcome for outcome in outcomes.values() if isinstance(outcome, Exception)], outcomes
    held = {outcome.generation: outcome for outcome in outcomes.values() if isinstance(outcome, lease.Lease)}
    newest = max(held, key=lambda generation: (len(generation), generation))
    current = json.loads(Path(url, f".writer_lease_{newest}").read_bytes())
    assert current["owner"] == held[newest].holder.owner
    for generation in held:  # every other job that took the lease finds its successor: it never writes again
        assert generation == newest or Path(url, f".writer_lease_{successor(generation)}").exists()
    if start != "forced":  # a job that looked once another had taken the lease saw it beat, and was refused
        assert len(held) == 1
        message = refused(url, socket.gethostname(), held[newest].holder.pid, newest, stale_after="80")
        for outcome in outcomes.values():
            assert outcome is held[newest] or re.fullmatch(message, outcome), outcome
