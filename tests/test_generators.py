"""The joint snapshot of the global generators (G4's watch around every batch): any draw of any
of them is seen, including the Gaussians `random` and numpy cache, and splitting it gives
each generator's own snapshot, which restores that generator exactly."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from dist_resume.randomness.global_generators import NAMES, generators, joint_snapshot

DRAWS = {
    "torch": lambda: torch.rand(1),
    "random": random.random,
    "random-cached-gauss": lambda: random.gauss(0, 1),
    "numpy": np.random.random_sample,
    "numpy-cached-gauss": np.random.standard_normal,
}


def _joint():
    watched = generators(NAMES)
    joint = joint_snapshot(watched)
    if joint is None:
        pytest.skip("the generators' memory layout was not found here: snapshots use the public state API")
    return watched, joint


@pytest.mark.parametrize("draw", DRAWS.values(), ids=DRAWS.keys())
def test_every_draw_changes_the_joint_snapshot_and_each_generator_restores_from_it(draw):
    watched, (snapshot, split) = _joint()
    random.seed(1)
    np.random.seed(1)
    # Leave a Gaussian cached in both, so that the next gauss draw touches only the cache.
    random.gauss(0, 1)
    np.random.standard_normal()
    before = snapshot()
    assert split(before) == [generator.snapshot() for generator in watched]
    draw()
    assert snapshot() != before
    for generator, own in zip(watched, split(before)):
        generator.restore(own)
    assert snapshot() == before
