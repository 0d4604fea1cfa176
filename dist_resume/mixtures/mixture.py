"""`Mixture`: a map-style dataset that blends named sources by weights, position by position."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import torch
from torch.utils.data import Dataset

from dist_resume.arguments import INT64_LIMIT, checked_int
from dist_resume.mixtures.definition import MAX_LENGTH, Definition
from dist_resume.mixtures.packed_sources import agreed_seq_len
from dist_resume.mixtures.progress import SourceProgress, frontier, order_of, source_progress
from dist_resume.mixtures.schedule import TOKENS_UNBOUND, Schedule, WeightsOrStages, parse_stages
from dist_resume.mixtures.source_orders import SourceOrders
from dist_resume.mixtures.stream_sources import agreed_canonical_streams, source_length
from dist_resume.mixtures.stream_steps import MixtureSteps
from dist_resume.mixtures.token_sources import draw_tokens, source_tokens, tokens_digest
from dist_resume.randomness.seeds import derive_seed
from dist_resume.state.fields import ResumeStateError
from dist_resume.state.saved import SavedStates, decode
from dist_resume.streams.sharded import ShardedStream


class MixtureOrder:
    """The keys `(source, index)` that the positions of one loader epoch read."""

    def __init__(self, schedule: Schedule, orders: SourceOrders, epoch_start: int) -> None:
        self._schedule = schedule
        self._orders = orders
        self._epoch_start = epoch_start

    def indices(self, positions: torch.Tensor) -> list[tuple[int, int]]:
        sources, draws = self._schedule.assign(positions + self._epoch_start)
        return list(zip(sources.tolist(), self._orders.indices(sources, draws).tolist()))


class Mixture(Dataset):
    """Named sources (map-style datasets and `ShardedStream`s) blended by weights; position
    `p` of the run reads one sample of one source, fixed by arithmetic on `p` and the
    weights (nothing is materialized).

    - `weights`: `{name: weight}`, or stages `[(start, {name: weight}), ...]` (the first at
      0) over the run's positions `epoch * length + p`. Over any `W` consecutive positions
      of a stage, source `s` has `|count - w_s * W| < window_bound(s)` (1 for two sources,
      2 for three or four; `w_s` its share of the stage's total weight). Weights (any real
      number type) are realized as integer quotas: exactly for integers and ratios with
      denominators up to 10**6, else to 2**-24 of the stage's total; a positive weight
      below that resolution is refused (`ValueError` naming the source), never dropped.
    - Each source is read in its own order: its `k`-th draw is position `k % len` of its
      source-epoch `k // len` (a permutation seeded by the loader's seed and the source's
      name when the loader has `shuffle=True`, else in order). No sample of a source
      repeats before all of it was read; a stage change continues every source where it
      was; a loader epoch continues them where the previous epoch left them.
    - `length`: positions per loader epoch (default: the sum of the source lengths).
    - `reweight`: a loader state saved with other weights or stages is refused (G6) unless
      True; then the saved stages hold up to the resume position (past every consumed
      position, see `progress.frontier`) and this mixture's weights from there on.

    With `ResumableDataLoader` every loader guarantee holds: it reads positions through
    `position_order` (the mixture's positions are never permuted), seeds each sample from
    its position (G4) and saves the definition with its state.

    A `ShardedStream` source's length is its items, and its source-epoch one pass over its
    epoch order (`stream_steps`: its draw `k` is item `k % len` of its order of epoch
    `k // len`). With stream sources the loader reads the mixture by global steps as it
    reads one stream: the same global batches at any world size and `num_workers` (G3),
    each source once per source-epoch, the state a few integers; the loader's `shuffle`
    orders the map-style sources only, and samples are seeded per worker stream, not per
    position. `canonical_streams`: the canonical stream count of every stream source; the
    sources must agree on it (`ValueError` naming them otherwise); None: theirs, or the
    first run's slot count. Stream sources are not indexed (`mixture[i]` is a TypeError).
    Packed sources (`packed` streams, `TokenSequences`; all of one `seq_len`, else a
    `ValueError`, as for packed sources next to others; `seq_len`: theirs, None when none
    is packed): `weigh='tokens'` (their default) makes the weights count real tokens: at
    every global step's end each source's real tokens since its stage began are within
    `window_bound / 2` of its share (half a sequence for two sources), each step within
    `window_bound`, at any world size and through resizes; exact for "concat" streams and
    token files, at the average fill for "fit" streams (exact at their source-epochs'
    ends). `weigh='samples'`: the weights count sequences (`seq_len + 1` token slots each).
    With `in_order=False` each worker reads whole batches of its own run of positions
    (`unordered_positions`): a stream source's draws are then its items in shard order, each
    source still once per source-epoch, every position once across resumes at any layout
    (G2), not the in-order global batches (no G3).
    """

    def __init__(self, sources: Mapping[str, Dataset | ShardedStream], weights: WeightsOrStages,
                 length: int | None = None, *, reweight: bool = False, canonical_streams: int | None = None,
                 weigh: str | None = None) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise ValueError("Mixture needs a non-empty mapping {name: dataset} of sources")
        for name in sources:
            if not isinstance(name, str) or not name or "\0" in name:
                raise ValueError(f"Mixture source names must be non-empty strings without NUL, got {name!r}")
        self.names = tuple(sources)
        self.canonical_streams = agreed_canonical_streams(sources, canonical_streams)
        self.seq_len = agreed_seq_len(sources)
        self.weigh = _checked_weigh(weigh, self.seq_len)
        self.lengths = tuple(source_length(sources[name]) for name in self.names)
        for name, count in zip(self.names, self.lengths):
            if count < 1:
                raise ValueError(f"Mixture source {name!r} is empty")
        self._sources = [sources[name] for name in self.names]
        counts_tokens = self.weigh == "tokens"
        self.tokens = tuple(source_tokens(source) for source in self._sources) if counts_tokens else None
        self._tokens_digest = derive_seed(*map(tokens_digest, self._sources)) if counts_tokens else 0
        if length is None:
            length = sum(self.lengths)
        self.length = checked_int("Mixture length (positions per epoch)", length, 1, MAX_LENGTH + 1)
        self.reweight = reweight
        self._requested = Schedule(parse_stages(weights, self.names), TOKENS_UNBOUND if counts_tokens else None)
        self.schedule = self._requested
        self._compositions: dict[tuple[Any, ...], Schedule] = {}

    @property
    def definition(self) -> Definition:
        return Definition(self.names, self.lengths, self.schedule.stages, self.seq_len or 0, self.tokens,
                          self._tokens_digest)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_compositions": {}}  # made again where needed: they hold per-epoch padding

    def composition(self, seed: int = 0, shuffle: bool = False, canonical_streams: int | None = None) -> Schedule:
        """What assigns the run's positions to `(source, draw)` for a loader of `seed` and
        `shuffle` whose stream sources are read by `canonical_streams` (default: the
        Mixture's): the schedule itself when the weights count samples; when they count
        tokens, the schedule paced by the real tokens of the draws in that order."""
        if not self.schedule.counts_tokens:
            return self.schedule
        if canonical_streams is None:
            canonical_streams = self.canonical_streams
        key = (self.schedule.stages, seed, shuffle, canonical_streams)
        if key not in self._compositions:
            if len(self._compositions) >= 4:
                self._compositions.clear()
            orders = SourceOrders(self.names, self.lengths, seed, shuffle)
            self._compositions[key] = Schedule(self.schedule.stages, [
                draw_tokens(source, index, orders, canonical_streams) for index, source in enumerate(self._sources)])
        return self._compositions[key]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: tuple[int, int] | int) -> Any:
        """`mixture[(source, index)]` reads a source; `mixture[p]` reads run position `p`
        with every source in its natural order (what a plain DataLoader sees)."""
        try:
            source, index = key  # the loader's keys: unpacking is the cheapest test
        except TypeError:
            ((source, index),) = self.keys([key])
        if isinstance(self._sources[source], ShardedStream):
            raise TypeError(f"Mixture source {self.names[source]!r} is a ShardedStream, which is read by canonical "
                            "streams, not by index: read this Mixture through ResumableDataLoader")
        return self._sources[source][index]

    def keys(self, positions: Sequence[int] | torch.Tensor, seed: int = 0, shuffle: bool = False) -> list[tuple[int, int]]:
        """`(source, index)` read at each run position, under a loader's `seed` and `shuffle`."""
        positions = torch.as_tensor(positions, dtype=torch.int64)
        if positions.numel() and int(positions.min()) < 0:
            raise IndexError(f"Mixture positions must be >= 0, got {int(positions.min())}")
        return self.position_order(checked_int("seed", seed, 0, INT64_LIMIT), 0, shuffle).indices(positions)

    def window_bound(self, name: str) -> int | Fraction:
        """Over any window of a stage, `|count of name - share * window| <` this; when the
        weights count tokens, `|real tokens of name - share * real tokens| <=` this, in
        tokens (`token_pacing`: `(1 + w (S - 2)) (seq_len + 1)`, one sequence for two
        sources; half that from a stage's start)."""
        return self.schedule.window_bound(self.names.index(name), (self.seq_len or 0) + 1)

    def progress(self, at: int | Mapping[str, Any], seed: int = 0, shuffle: bool = False,
                 canonical_streams: int | None = None) -> dict[str, SourceProgress]:
        """Per source, its draws before run position `at`, or before the frontier of a loader
        state (`loader.state_dict()`: past every position its ranks consumed); when the
        weights count tokens, also their real tokens, in the order of a loader of `seed`,
        `shuffle` and `canonical_streams` (a state's own, when `at` is a state)."""
        if isinstance(at, Mapping):
            saved = decode(at)
            position = frontier(saved, at)
            seed, shuffle, canonical_streams = order_of(saved, at)
        else:
            position = checked_int("position", at, 0)
        return source_progress(self.definition, self.composition(seed, shuffle, canonical_streams), position)

    # -- the ResumableDataLoader protocols (positions.dataset_order, streams.steps) ---------

    def step_source(self, seed: int, shuffle: bool) -> MixtureSteps | None:
        """With stream sources, what reads this Mixture by global steps; else None."""
        if not any(isinstance(source, ShardedStream) for source in self._sources):
            return None
        return MixtureSteps(self, self._sources, seed, shuffle)

    def position_order(self, seed: int, epoch: int, shuffle: bool) -> MixtureOrder:
        return MixtureOrder(self.composition(seed, shuffle), SourceOrders(self.names, self.lengths, seed, shuffle),
                            epoch * self.length)

    def definition_state(self) -> list[int]:
        return self.definition.encode()

    def definition_digest(self) -> int:
        digest = self.definition.sources_digest()
        if self.tokens is not None:
            return derive_seed(digest, self.seq_len, *self.tokens, self._tokens_digest)
        return digest if self.seq_len is None else derive_seed(digest, self.seq_len)

    def resume_definition(self, values: list[int] | None, saved: SavedStates,
                          state_dict: Mapping[str, Any]) -> Callable[[], None]:
        if values is None:
            raise ResumeStateError("loader state was saved without a Mixture; this loader's dataset is a Mixture")
        theirs = Definition.decode(values)
        ours = self.definition
        if theirs.seq_len is not None and theirs.seq_len != ours.seq_len:
            raise ResumeStateError(f"loader state was saved for a Mixture of sources {_packing(theirs.seq_len)}; this "
                                   f"Mixture's sources are {_packing(ours.seq_len)}")
        if (theirs.tokens is None) != (ours.tokens is None):
            raise ResumeStateError(f"loader state was saved for a Mixture whose weights {theirs.describe_weighing()}; "
                                   f"this Mixture's weights {ours.describe_weighing()} (Mixture(weigh="
                                   f"{'tokens' if theirs.tokens is not None else 'samples'!r}) resumes it)")
        if (theirs.names, theirs.lengths) != (ours.names, ours.lengths):
            raise ResumeStateError(
                f"loader state was saved for a Mixture of {theirs.describe_sources()}; "
                f"this Mixture has {ours.describe_sources()}"
            )
        if (theirs.tokens, theirs.tokens_digest) != (ours.tokens, ours.tokens_digest):
            where = "" if theirs.tokens != ours.tokens else " (as many in all, lying otherwise in the shards or files)"
            raise ResumeStateError(f"loader state was saved for a Mixture whose weights count tokens over sources of "
                                   f"{theirs.describe_tokens()}; these sources hold {ours.describe_tokens()}{where}: "
                                   "its positions' sources follow the real tokens, so it cannot continue over other data")
        saved_schedule = Schedule(theirs.stages, self._requested.draws)
        if saved_schedule == self.schedule:
            return lambda: None
        if not self.reweight:
            raise ResumeStateError(
                f"loader state was saved with Mixture weights {theirs.describe_stages()}; this Mixture has "
                f"{ours.describe_stages()} (quotas per stage); pass reweight=True to Mixture to apply its "
                "weights from the resume position on"
            )
        saved.require_complete("changing a Mixture's weights")
        merged = saved_schedule.rebased(self._requested, frontier(saved, state_dict))

        def adopt() -> None:
            self.schedule = merged

        return adopt


def _checked_weigh(weigh: str | None, seq_len: int | None) -> str:
    """What the weights count: "tokens" (the default for packed sources) or "samples"."""
    if weigh is None:
        return "samples" if seq_len is None else "tokens"
    if weigh not in ("tokens", "samples"):
        raise ValueError(f"Mixture weigh must be 'tokens' or 'samples' (what the weights count), got {weigh!r}")
    if weigh == "tokens" and seq_len is None:
        raise ValueError("Mixture(weigh='tokens') needs packed sources (packed() streams, TokenSequences): only "
                         "their sequences' real tokens are known")
    return weigh


def _packing(seq_len: int) -> str:
    return f"packed to seq_len={seq_len}" if seq_len else "not packed"
