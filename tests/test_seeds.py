"""Per-sample seeds (G4): the batched derivation gives the same seeds as the scalar one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dist_resume.randomness.seeds import derive_seed, derive_seeds


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**20), st.lists(st.integers(0, 2**62), max_size=50))
def test_derive_seeds_matches_derive_seed(seed: int, epoch: int, positions: list[int]) -> None:
    assert derive_seeds(seed, epoch, positions) == [derive_seed(seed, epoch, position) for position in positions]


def test_sample_seeds_are_pinned_across_versions() -> None:
    """Augmentations of an existing run must not change with an upgrade (G4)."""
    assert derive_seed(0, 0, 0) == 2558736989570252433
    assert derive_seed(7, 3, 123456789) == 7751518122152357169


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**20), st.integers(0, 2**62), st.integers(0, 50))
def test_derive_seeds_of_a_range_matches_derive_seed(seed: int, epoch: int, start: int, count: int) -> None:
    positions = range(start, start + count)
    assert derive_seeds(seed, epoch, positions) == [derive_seed(seed, epoch, position) for position in positions]
