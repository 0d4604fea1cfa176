"""Checks a demo job's records against an uninterrupted single-process reference.

Steps trained after the last committed checkpoint are rolled back by a crash: the next
run resumes from the checkpoint and trains them again. So run ``k`` counts only up to the
step run ``k+1`` resumed from; the final run counts in full.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field

from dist_resume.demo.data import SyntheticDataset
from dist_resume.demo.records import (
    EpochPositions,
    Run,
    StepRecord,
    fingerprint,
    read_runs,
)
from dist_resume.loader.resumable import ResumableDataLoader

# (epoch, position) -> fingerprint of the augmented sample, per global step
Reference = dict[int, dict[tuple[int, int], str]]


def reference(dataset_size: int, seed: int, global_batch: int, epochs: int) -> Reference:
    """What an uninterrupted single-rank job with the same global batch trains on, step by step."""
    loader = ResumableDataLoader(SyntheticDataset(dataset_size), batch_size=global_batch, shuffle=True,
                                 seed=seed, rank=0, world_size=1)
    positions = EpochPositions(dataset_size, seed, True)
    steps: Reference = {}
    while loader.epoch < epochs:
        epoch = loader.epoch
        for features, _, indices in loader:
            samples = zip(positions(epoch, indices.tolist()), features)
            steps[len(steps) + 1] = {(epoch, p): fingerprint(sample) for p, sample in samples}
    return steps


@dataclass
class Phase:
    """One run of the job and what of it counts."""

    run: Run
    kept: list[StepRecord]
    committed: int  # the step the next run resumed from (the final run: its last step)
    problems: list[str] = field(default_factory=list)

    @property
    def rolled_back(self) -> int:
        return len({r.step for r in self.run.steps} - {r.step for r in self.kept})

    @property
    def samples(self) -> int:
        return sum(len(r.positions) - r.padding for r in self.kept)

    @property
    def padding(self) -> int:
        return sum(r.padding for r in self.kept)


@dataclass(frozen=True)
class Check:
    """One guarantee's verdict over the whole job."""

    name: str
    passed: bool
    detail: str


@dataclass
class Verdict:
    phases: list[Phase]
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks) and not any(p.problems for p in self.phases)


def phases_of(runs: list[Run]) -> list[Phase]:
    """Each run with the records that survived the next run's resume."""
    phases = []
    for run, following in zip(runs, [*runs[1:], None]):
        limit = following.resumed_from if following is not None else run.last_step
        phases.append(Phase(run, [r for r in run.steps if r.step <= limit], limit))
    return phases


def verify(record_dir: str | os.PathLike, dataset_size: int, seed: int, global_batch: int,
           epochs: int) -> Verdict:
    """G2, G3, G4 over every run recorded in ``record_dir``."""
    runs = read_runs(record_dir)
    if not runs:
        raise ValueError(f"no runs recorded in {record_dir}")
    phases = phases_of(runs)
    expected = reference(dataset_size, seed, global_batch, epochs)
    checks = [
        _check_steps(phases, len(expected)),
        _check_exactly_once(phases, dataset_size, epochs),
        _check_global_steps(phases, expected),
        _check_augmentations(phases, expected),
    ]
    return Verdict(phases, checks)


def _blame(phase: Phase, problem: str, problems: list[str]) -> None:
    phase.problems.append(problem)
    problems.append(f"phase {phase.run.number + 1}: {problem}")


def _summary(problems: list[str]) -> str:
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return "; ".join(problems[:3]) + more


def _check_steps(phases: list[Phase], total: int) -> Check:
    """Every global step 1..total trained once, by every rank of the run that kept it."""
    problems: list[str] = []
    owners: dict[int, int] = {}
    for phase in phases:
        ranks = collections.defaultdict(list)
        for record in phase.kept:
            ranks[record.step].append(record.rank)
        for step, got in sorted(ranks.items()):
            if sorted(got) != list(range(phase.run.world_size)):
                _blame(phase, f"step {step} recorded by ranks {sorted(got)} of {phase.run.world_size}", problems)
            if step in owners:
                _blame(phase, f"step {step} also kept from phase {owners[step] + 1}", problems)
            owners[step] = phase.run.number
    missing = sorted(set(range(1, total + 1)) - set(owners))
    if missing:
        problems.append(f"global steps {missing} were never trained")
    detail = _summary(problems) if problems else f"steps 1-{total} each trained once"
    return Check("steps: no step lost or repeated", not problems, detail)


def _check_exactly_once(phases: list[Phase], length: int, epochs: int) -> Check:
    """G2: per epoch, every position once; padding repeats only the start of the epoch."""
    problems: list[str] = []
    counts = {epoch: collections.Counter() for epoch in range(epochs)}
    padding: dict[int, list[int]] = collections.defaultdict(list)
    for phase in phases:
        for record in phase.kept:
            real = len(record.positions) - record.padding
            counts.setdefault(record.epoch, collections.Counter()).update(record.positions[:real])
            padding[record.epoch] += record.positions[real:]
            if record.padding >= phase.run.world_size:
                _blame(phase, f"step {record.step} rank {record.rank} has {record.padding} padding samples", problems)
    for epoch, count in sorted(counts.items()):
        missing = sorted(set(range(length)) - set(count))
        repeated = sorted(p for p, n in count.items() if n > 1)
        outside = sorted(set(count) - set(range(length)))
        if missing or repeated or outside or epoch >= epochs:
            problems.append(f"epoch {epoch}: missing positions {missing[:10]}, repeated {repeated[:10]}, "
                            f"unexpected {outside[:10]}")
        if sorted(padding[epoch]) != list(range(len(padding[epoch]))):
            problems.append(f"epoch {epoch}: padding positions {sorted(padding[epoch])} are not the epoch's start")
    pads = ", ".join(f"epoch {e}: {len(padding[e])}" for e in range(epochs))
    detail = _summary(problems) if problems else f"{length} samples x {epochs} epochs (padding {pads})"
    return Check("G2 every sample exactly once per epoch", not problems, detail)


def _check_global_steps(phases: list[Phase], expected: Reference) -> Check:
    """G3: global step k holds the reference's samples (the global batch never changed)."""
    problems: list[str] = []
    got: dict[int, set[tuple[int, int]]] = collections.defaultdict(set)
    for phase in phases:
        for record in phase.kept:
            real = len(record.positions) - record.padding
            got[record.step] |= {(record.epoch, p) for p in record.positions[:real]}
    for phase in phases:
        for step in sorted({r.step for r in phase.kept}):
            if got[step] != set(expected.get(step, {})):
                _blame(phase, f"global step {step} holds other samples than the reference", problems)
    detail = _summary(problems) if problems else f"{len(got)} global steps equal to the uninterrupted run"
    return Check("G3 global batches equal the reference", not problems, detail)


def _check_augmentations(phases: list[Phase], expected: Reference) -> Check:
    """G4: every sample's augmented values equal the reference's at its (epoch, position)."""
    problems: list[str] = []
    by_position = {key: value for step in expected.values() for key, value in step.items()}
    checked = 0
    for phase in phases:
        for record in phase.kept:
            for position, value in zip(record.positions, record.fingerprints):
                checked += 1
                if by_position.get((record.epoch, position)) != value:
                    _blame(phase, f"epoch {record.epoch} position {position} (step {record.step}) "
                                  "was augmented differently", problems)
    detail = _summary(problems) if problems else f"{checked} augmented samples equal the reference"
    return Check("G4 augmentations equal the reference", not problems, detail)
