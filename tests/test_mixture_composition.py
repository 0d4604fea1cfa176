"""The composition arithmetic of `Mixture` (hypothesis): per-window counts, draws per
source without repetition or skip, stage changes, reweighting, weights as quotas."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.mixtures.quotas import MAX_TOTAL, quotas
from dist_resume.mixtures.schedule import Schedule, Stage
from dist_resume.mixtures.source_orders import SourceOrders
from dist_resume.mixtures.split_tree import SplitTree

quota_lists = st.lists(st.integers(0, 50), min_size=1, max_size=7).filter(any)


def _sources(tree_or_schedule, count: int) -> list[int]:
    return tree_or_schedule.assign(torch.arange(count))[0].tolist()


@settings(max_examples=150, deadline=None)
@given(quota_lists, st.integers(0, 2**40), st.data())
def test_window_counts_stay_within_the_depth_bound(quota: list[int], phase_key: int, data) -> None:
    """Over any window of W consecutive positions, |count_s - W * q_s / total| < depth(s)
    (< 1 for two sources, < 2 for three or four)."""
    tree = SplitTree(quota, phase_key)
    total = sum(quota)
    length = 3 * total + 40
    sources = _sources(tree, length)
    start = data.draw(st.integers(0, length - 1))
    stop = data.draw(st.integers(start, length))
    window = Counter(sources[start:stop])
    for source, q in enumerate(quota):
        bound = max(1, tree.depth_of(source))
        assert abs(window[source] - (stop - start) * Fraction(q, total)) < bound
        assert bound <= max(1, (len(quota) - 1).bit_length())


@settings(max_examples=100, deadline=None)
@given(quota_lists, st.integers(0, 2**40), st.integers(0, 10**9))
def test_counts_and_draw_numbers_agree_with_the_assignment(quota: list[int], phase_key: int, offset: int) -> None:
    """count(s, n) is the number of positions of s among the first n, and the draw number
    at a position is the count before it: draws of a source are 0, 1, 2, ... in order."""
    tree = SplitTree(quota, phase_key)
    positions = torch.arange(offset, offset + 200)
    sources, draws = tree.assign(positions)
    for source in range(len(quota)):
        mine = draws[sources == source].tolist()
        first = tree.count(source, offset)
        assert mine == list(range(first, first + len(mine)))
        assert tree.count(source, offset + 200) == first + len(mine)
        if quota[source] == 0:
            assert mine == []


stage_lists = st.lists(st.tuples(st.integers(1, 60), st.lists(st.integers(0, 9), min_size=3, max_size=3).filter(any)),
                       min_size=1, max_size=4)


def _schedule(spans_and_quotas) -> Schedule:
    start, stages = 0, []
    for span, quota in spans_and_quotas:
        stages.append(Stage(start, tuple(quota)))
        start += span
    return Schedule(stages)


@settings(max_examples=100, deadline=None)
@given(stage_lists)
def test_stage_changes_continue_every_source_where_it_was(spans_and_quotas) -> None:
    """Across stage boundaries each source's draws stay 0, 1, 2, ... (none repeated or
    skipped), and draws_before(p) counts them."""
    schedule = _schedule(spans_and_quotas)
    length = schedule.starts[-1] + 50
    sources, draws = schedule.assign(torch.arange(length))
    for source in range(3):
        mine = draws[sources == source].tolist()
        assert mine == list(range(len(mine)))
    for position in (0, *schedule.starts, length):
        assert schedule.draws_before(position) == [int(((sources[:position] == s)).sum()) for s in range(3)]
    for stage in schedule.stages:  # a stage's positions follow its own quotas
        in_stage = sources[stage.start : stage.start + 1].tolist()
        assert all(stage.quotas[s] > 0 for s in in_stage)


@settings(max_examples=100, deadline=None)
@given(stage_lists, stage_lists, st.integers(0, 200))
def test_reweighting_keeps_the_past_and_continues_each_source(saved_stages, requested_stages, position) -> None:
    """rebased(requested, R): positions before R read what they read; from R on the
    requested weights hold; each source's draws still run 0, 1, 2, ...; rebasing again at a
    later position with the same request changes nothing past the first rebase."""
    saved, requested = _schedule(saved_stages), _schedule(requested_stages)
    merged = saved.rebased(requested, position)
    length = max(position, merged.starts[-1]) + 60
    old = saved.assign(torch.arange(position))
    new = merged.assign(torch.arange(length))
    assert torch.equal(old[0], new[0][:position]) and torch.equal(old[1], new[1][:position])
    for source in range(3):
        mine = new[1][new[0] == source].tolist()
        assert mine == list(range(len(mine)))
    assert merged.stages[merged.stage_index(position)].quotas == requested.stages[requested.stage_index(position)].quotas
    for later in (position, position + 7, length):
        assert merged.rebased(requested, later) == merged


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=4), st.integers(0, 2**62), st.booleans())
def test_each_source_epoch_reads_every_sample_once(lengths: list[int], seed: int, shuffle: bool) -> None:
    """Draws [e*len, (e+1)*len) of a source read each of its samples once, in an order that
    differs between source-epochs when shuffled."""
    orders = SourceOrders([f"s{i}" for i in range(len(lengths))], lengths, seed, shuffle)
    for source, length in enumerate(lengths):
        draws = torch.arange(3 * length)
        indices = orders.indices(torch.full_like(draws, source), draws).tolist()
        epochs = [indices[e * length : (e + 1) * length] for e in range(3)]
        assert all(sorted(epoch) == list(range(length)) for epoch in epochs)
        if not shuffle:
            assert epochs[0] == list(range(length))


def test_weights_become_exact_quotas_or_rounded_ones() -> None:
    assert quotas([0.6, 0.3, 0.1]) == [6, 3, 1]
    assert quotas([1 / 3, 2 / 3]) == [1, 2]
    assert quotas([Fraction(1, 7), 2, 0]) == [1, 14, 0]
    rounded = quotas([0.1234567, 0.7654321, 0.000001, 1e-7])
    assert sum(rounded) == MAX_TOTAL
    with pytest.raises(ValueError, match="must not all be zero"):
        quotas([0, 0.0])
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        quotas([1, -0.5])
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        quotas([1, float("nan")])
