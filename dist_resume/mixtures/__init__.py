"""Weighted mixtures of map-style datasets, with weight schedules, exact and elastic: a
`Mixture` is a dataset that owns its order (see `positions.dataset_order`), so the loader
reads it like any other. Imports `positions`, `state`, `randomness` and `arguments`;
never the loader."""

from dist_resume.mixtures.mixture import Mixture
from dist_resume.mixtures.progress import SourceProgress

__all__ = ["Mixture", "SourceProgress"]
