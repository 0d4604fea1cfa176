"""Weighted mixtures of map-style datasets, with weight schedules, exact and elastic."""

from .mixture import Mixture
from .progress import SourceProgress

__all__ = ["Mixture", "SourceProgress"]
