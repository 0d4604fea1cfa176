"""The schedule of stages: which stage's weights hold at each position of the run, and how
many draws each source has had at any position (sources continue across stages)."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Union

import numpy
import torch

from dist_resume.arguments import checked_int
from dist_resume.mixtures.quotas import MAX_POSITION, quotas
from dist_resume.mixtures.split_tree import SplitTree

Weights = Mapping[str, Real]
WeightsOrStages = Union[Weights, Sequence[tuple[int, Weights]]]


@dataclass(frozen=True)
class Stage:
    """From run position `start` on (until the next stage), source `s` gets `quotas[s]`
    of every `sum(quotas)` positions."""

    start: int
    quotas: tuple[int, ...]


def parse_stages(weights: WeightsOrStages, names: Sequence[str]) -> list[Stage]:
    """`{name: weight}` (one stage from position 0) or `[(start, {name: weight}), ...]`."""
    pairs = [(0, weights)] if isinstance(weights, Mapping) else list(weights)
    if not pairs:
        raise ValueError("mixture weights: the list of stages is empty")
    stages = []
    for pair in pairs:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[1], Mapping)):
            raise ValueError(f"mixture stage must be (start position, {{source: weight}}), got {pair!r}")
        start, stage_weights = pair
        start = checked_int("mixture stage start", start, 0, MAX_POSITION)
        if set(stage_weights) != set(names):
            missing, unknown = sorted(set(names) - set(stage_weights)), sorted(set(stage_weights) - set(names))
            raise ValueError(
                f"mixture stage at position {start} must give a weight to every source {list(names)} "
                f"(missing {missing}, unknown {unknown}); a weight may be 0"
            )
        stages.append(Stage(start, tuple(quotas({name: stage_weights[name] for name in names}, start))))
    if stages[0].start != 0:
        raise ValueError(f"the first mixture stage must start at position 0, got {stages[0].start}")
    for before, after in zip(stages, stages[1:]):
        if after.start <= before.start:
            raise ValueError(f"mixture stage starts must increase, got {before.start} then {after.start}")
    return stages


class Schedule:
    """Stages over the run's positions (`epoch * epoch_length + p`). A source's draws
    count over the whole run: a stage continues every source where the previous left it."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self.stages = tuple(stages)
        self.starts = [stage.start for stage in self.stages]
        self._trees = [SplitTree(list(stage.quotas), stage.start) for stage in self.stages]
        self.sources = len(self.stages[0].quotas)
        # Draws of each source before each stage: O(stages * sources) tree walks.
        self._offsets = [[0] * self.sources]
        for index in range(1, len(self.stages)):
            span = self.starts[index] - self.starts[index - 1]
            tree, previous = self._trees[index - 1], self._offsets[-1]
            self._offsets.append([previous[s] + tree.count(s, span) for s in range(self.sources)])
        self._starts_array = numpy.array(self.starts, dtype=numpy.int64)
        self._offsets_array = numpy.array(self._offsets, dtype=numpy.int64)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.stages == other.stages

    def __hash__(self) -> int:
        return hash(self.stages)

    def stage_index(self, position: int) -> int:
        return bisect.bisect_right(self.starts, position) - 1

    def window_bound(self, source: int) -> int:
        """Over any window inside a stage, `|count of source - share * window| <` this
        (see `split_tree`; a lone source's count is exact)."""
        return max(1, *(tree.depth_of(source) for tree in self._trees))

    def draws_before(self, position: int) -> list[int]:
        """Draws of each source among run positions `[0, position)`."""
        _check_position(position)
        index = self.stage_index(position)
        tree, offsets = self._trees[index], self._offsets[index]
        within = position - self.starts[index]
        return [offsets[s] + tree.count(s, within) for s in range(self.sources)]

    def assign(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For run positions (int64), the source of each and its draw number (how many
        draws of that source come before it in the run)."""
        if positions.numel() == 0:
            return positions.clone(), positions.clone()
        _check_position(int(positions.max()))
        values = positions.numpy()
        stage = numpy.searchsorted(self._starts_array, values, side="right") - 1
        sources = numpy.empty_like(values)
        draws = numpy.empty_like(values)
        for index in numpy.unique(stage).tolist():
            chosen = stage == index if len(self.stages) > 1 else slice(None)
            source, within = self._trees[index].assign_array(values[chosen] - self.starts[index])
            sources[chosen] = source
            draws[chosen] = self._offsets_array[index][source] + within
        return torch.from_numpy(sources), torch.from_numpy(draws)

    def rebased(self, requested: Schedule, position: int) -> Schedule:
        """This schedule before `position`, `requested` from `position` on: the stage of
        `requested` in force at `position` starts there (the stage this schedule has in
        force continues if its weights are the same), its later stages keep their starts."""
        index = self.stage_index(position)
        new_index = requested.stage_index(position)
        in_force, wanted = self.stages[index], requested.stages[new_index]
        if in_force.quotas == wanted.quotas:
            kept = list(self.stages[: index + 1])
        else:
            kept = list(self.stages[:index]) + ([in_force] if in_force.start < position else [])
            kept.append(Stage(position, wanted.quotas))
        return Schedule(kept + list(requested.stages[new_index + 1 :]))


def _check_position(position: int) -> None:
    if position >= MAX_POSITION:
        raise ValueError(f"mixture position {position} is past the largest supported run position {MAX_POSITION - 1}")
