"""The schedule of stages: which stage's weights hold at each position of the run, and how
many draws each source has had at any position (sources continue across stages)."""

from __future__ import annotations

import bisect
from fractions import Fraction
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Union

import numpy
import torch

from dist_resume.arguments import checked_int
from dist_resume.mixtures.quotas import MAX_POSITION, quotas
from dist_resume.mixtures.split_tree import SplitTree
from dist_resume.mixtures.token_pacing import DrawTokens, TokenStage, token_bound

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
    count over the whole run: a stage continues every source where the previous left it.

    `draws`: None, each stage composes positions by its quotas (`split_tree`: weights count
    samples); each source's `DrawTokens`, by the real tokens of the draws (`token_pacing`:
    weights count tokens); `TOKENS_UNBOUND`, weights count tokens but the draws' tokens are
    not known here (they depend on the loader's order): asking for positions is an error."""

    def __init__(self, stages: Sequence[Stage], draws: Sequence[DrawTokens] | object | None = None) -> None:
        self.stages = tuple(stages)
        self.starts = [stage.start for stage in self.stages]
        self.sources = len(self.stages[0].quotas)
        self.draws = draws
        self._parts: list[SplitTree | TokenStage] | None = None
        self._offsets: list[list[int]] = []
        self._starts_array = numpy.array(self.starts, dtype=numpy.int64)
        self._offsets_array = numpy.empty(0, dtype=numpy.int64)

    @property
    def counts_tokens(self) -> bool:
        """Whether the weights count real tokens (else samples)."""
        return self.draws is not None

    def _composed(self) -> list[SplitTree | TokenStage]:
        """Each stage's composition, and the draws of each source before each stage:
        O(stages * sources) counts, made when first needed."""
        if self._parts is None:
            if self.draws is TOKENS_UNBOUND:
                raise ValueError("this Mixture's weights count tokens, so which source a position reads depends on "
                                 "the order its sources' sequences are read in: ask "
                                 "mixture.composition(seed, shuffle, canonical_streams) for it")
            parts, offsets = [], [[0] * self.sources]
            for index, stage in enumerate(self.stages):
                if index:
                    span = self.starts[index] - self.starts[index - 1]
                    offsets.append([offsets[-1][s] + parts[-1].count(s, span) for s in range(self.sources)])
                parts.append(SplitTree(list(stage.quotas), stage.start) if self.draws is None
                             else TokenStage(stage.quotas, offsets[-1], self.draws))  # type: ignore[arg-type]
            self._parts, self._offsets = parts, offsets
            self._offsets_array = numpy.array(offsets, dtype=numpy.int64)
        return self._parts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.stages == other.stages

    def __hash__(self) -> int:
        return hash(self.stages)

    def stage_index(self, position: int) -> int:
        return bisect.bisect_right(self.starts, position) - 1

    def window_bound(self, source: int, width: int = 1) -> int | Fraction:
        """Over any window inside a stage, `|count of source - share * window| <` this
        (see `split_tree`; a lone source's count is exact). Weights that count tokens:
        `|tokens of source - share * tokens| <=` this, in tokens (`width`: the most real
        tokens a draw holds; `token_pacing`)."""
        if self.counts_tokens:
            return max(2 * token_bound(stage.quotas, source, width) for stage in self.stages)
        return max(1, *(part.depth_of(source) for part in self._composed()))  # type: ignore[union-attr]

    def draws_before(self, position: int) -> list[int]:
        """Draws of each source among run positions `[0, position)`."""
        _check_position(position)
        parts = self._composed()
        index = self.stage_index(position)
        part, offsets = parts[index], self._offsets[index]
        within = position - self.starts[index]
        return [offsets[s] + part.count(s, within) for s in range(self.sources)]

    def assign(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For run positions (int64), the source of each and its draw number (how many
        draws of that source come before it in the run)."""
        if positions.numel() == 0:
            return positions.clone(), positions.clone()
        _check_position(int(positions.max()))
        parts = self._composed()
        values = positions.numpy()
        stage = numpy.searchsorted(self._starts_array, values, side="right") - 1
        sources = numpy.empty_like(values)
        draws = numpy.empty_like(values)
        for index in numpy.unique(stage).tolist():
            chosen = stage == index if len(self.stages) > 1 else slice(None)
            source, within = parts[index].assign_array(values[chosen] - self.starts[index])
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
        return Schedule(kept + list(requested.stages[new_index + 1 :]), self.draws)


TOKENS_UNBOUND = object()  # weights count tokens; the draws' tokens are not known to this schedule


def _check_position(position: int) -> None:
    if position >= MAX_POSITION:
        raise ValueError(f"mixture position {position} is past the largest supported run position {MAX_POSITION - 1}")
