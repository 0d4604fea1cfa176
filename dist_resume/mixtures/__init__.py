"""Weighted mixtures of map-style datasets and `ShardedStream`s, with weight schedules,
exact and elastic: a `Mixture` is a dataset that owns its order (see
`positions.dataset_order`), and, with stream sources, a step source (see `streams.steps`),
so the loader reads it like any other; packed sources (`packing`) all of one sequence
length, whose weights then count tokens. Imports `packing`, `streams`, `positions`, `state`,
`randomness` and `arguments`; never the loader."""

from dist_resume.mixtures.mixture import Mixture
from dist_resume.mixtures.progress import SourceProgress

__all__ = ["Mixture", "SourceProgress"]
