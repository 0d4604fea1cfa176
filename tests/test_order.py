"""The epoch order: a permutation drawn from (seed, epoch), stable across versions."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.positions.epoch_order import EpochOrder


@settings(max_examples=200, deadline=None)
@given(length=st.integers(0, 5000), seed=st.integers(0, 2**63 - 1), epoch=st.integers(0, 10**6))
def test_shuffled_order_is_a_permutation(length, seed, epoch):
    order = EpochOrder(length, seed, epoch, shuffle=True).indices(torch.arange(length))
    assert sorted(order) == list(range(length))


@settings(max_examples=20, deadline=None)
@given(length=st.integers(2**40, 2**62), data=st.data())
def test_any_position_of_a_huge_epoch_maps_in_range_without_materializing(length, data):
    positions = data.draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=50, unique=True))
    indices = EpochOrder(length, 7, 3, shuffle=True).indices(torch.tensor(positions))
    assert all(0 <= i < length for i in indices)
    assert len(set(indices)) == len(indices)


def test_slices_agree_with_the_whole_epoch():
    order = EpochOrder(10_007, 1, 2, shuffle=True)
    whole = order.indices(torch.arange(10_007))
    assert order.indices(torch.arange(5000, 5100)) == whole[5000:5100]
    assert order.indices(torch.tensor([10_006, 3, 3])) == [whole[10_006], whole[3], whole[3]]


def test_order_is_pinned_across_versions():
    """A checkpoint resumed by another torch or dist_resume version must see the same
    order: these values may never change (format version 1)."""
    assert EpochOrder(20, 0, 0, shuffle=True).indices(torch.arange(20)) == [
        12, 19, 1, 8, 5, 18, 6, 14, 10, 0, 13, 9, 11, 17, 15, 7, 4, 16, 2, 3
    ]
    assert EpochOrder(10**9, 42, 7, shuffle=True).indices(torch.tensor([0, 1, 999_999_999])) == [
        791475182, 826046477, 802776667
    ]


def test_epochs_and_seeds_draw_different_orders():
    orders = {tuple(EpochOrder(50, seed, epoch, shuffle=True).indices(torch.arange(50))) for seed in (0, 1) for epoch in (0, 1, 2)}
    assert len(orders) == 6


def test_unshuffled_order_is_the_identity():
    assert EpochOrder(5, 3, 9, shuffle=False).indices(torch.arange(5)) == [0, 1, 2, 3, 4]


def test_order_looks_random():
    """No structure a model could notice: few fixed points, no correlation with position."""
    length = 100_000
    order = torch.tensor(EpochOrder(length, 3, 0, shuffle=True).indices(torch.arange(length)), dtype=torch.float64)
    positions = torch.arange(length, dtype=torch.float64)
    assert (order == positions).sum() < 10
    assert abs(torch.corrcoef(torch.stack([order, positions]))[0, 1]) < 0.01
    gaps = (order[1:] - order[:-1]).abs().mean() / length
    assert abs(gaps - 1 / 3) < 0.01  # mean distance of two uniform draws


@settings(max_examples=100, deadline=None)
@given(length=st.one_of(st.integers(1, 3000), st.integers(2**40, 2**62)), seed=st.integers(0, 2**63 - 1),
       epoch=st.integers(0, 10**6), shuffle=st.booleans(), data=st.data())
def test_position_of_inverts_the_order(length, seed, epoch, shuffle, data):
    """The place of an index in the epoch (what a Mixture weighing tokens needs of a token
    file's padded last sequence) is the inverse of the order, for small and huge epochs."""
    order = EpochOrder(length, seed, epoch, shuffle)
    positions = data.draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=30))
    indices = order.indices(torch.tensor(positions))
    assert [order.position_of(index) for index in indices] == positions
