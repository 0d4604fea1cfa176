"""The composition arithmetic of `Mixture` (hypothesis): per-window counts, draws per
source without repetition or skip, stage changes, reweighting, weights as quotas."""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume import Mixture
from dist_resume.mixtures.quotas import quotas
from dist_resume.mixtures.schedule import Schedule, Stage
from dist_resume.mixtures.source_orders import SourceOrders
from dist_resume.mixtures.split_tree import SplitTree

from .mixture_datasets import Labelled

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


def _named(*weights) -> dict:
    return {f"s{i}": weight for i, weight in enumerate(weights)}


def test_weights_become_exact_quotas_or_rounded_ones() -> None:
    assert quotas(_named(0.6, 0.3, 0.1)) == [6, 3, 1]
    assert quotas(_named(1 / 3, 2 / 3)) == [1, 2]
    assert quotas(_named(0.1 + 0.2, 0.7)) == [3, 7]  # within 2**-24 of 3/10: meant as 3/10
    assert quotas(_named(Fraction(1, 7), 2, 0)) == [1, 14, 0]
    # 1e-7 was snapped to the ratio 0 and dropped; it is 2 of 2**24 parts of the total
    assert quotas(_named(0.1234567, 0.7654321, 0.000001, 1e-7)) == [2330164, 14447031, 19, 2]
    assert quotas(_named(1.0, 4e-7)) == [16777209, 7]  # issue 24 point 8: b was never drawn
    with pytest.raises(ValueError, match="must not all be zero"):
        quotas(_named(0, 0.0))
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        quotas(_named(1, -0.5))
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        quotas(_named(1, float("nan")))


@pytest.mark.parametrize(
    "weights, start, message",
    [
        ({"web": 1.0, "rare": 1e-9}, 0,
         "mixture weight 1e-09 of source 'rare' (stage at position 0) rounds to 0: weights are realized to 2**-24 "
         "of the stage's total (1), so the source would never be drawn; give it 0, or at least 5.97e-08"),
        ({"a": 3, "b": 2**30}, 50,
         "mixture weight 3 of source 'a' (stage at position 50) rounds to 0: weights are realized to 2**-24 of the "
         "stage's total (1.07374e+09), so the source would never be drawn; give it 0, or at least 64.1"),
    ],
)
def test_a_positive_weight_that_rounds_to_zero_is_refused(weights, start, message) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        quotas(weights, start)
    smallest = float(message.rsplit(" ", 1)[1])
    name = message.split("of source '")[1].split("'")[0]
    assert quotas({**weights, name: smallest}, start)[list(weights).index(name)] >= 1  # the advice holds


_WEIGHT = st.one_of(
    st.just(0),
    st.integers(1, 2**40),
    st.floats(min_value=1e-12, max_value=1e6, allow_nan=False, allow_infinity=False),
    st.fractions(min_value=Fraction(1, 10**9), max_value=10**6),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_WEIGHT, min_size=1, max_size=5).filter(any))
def test_every_source_with_a_positive_weight_is_drawn_or_refused(weights) -> None:
    """Issue 24 point 8: a positive weight never silently gets no draws. Either the mixture
    is refused with an error naming the source, or over a window of two quota periods
    every source with a positive weight is drawn and every source of weight 0 is not."""
    sources = {f"s{i}": Labelled(i, 3) for i in range(len(weights))}
    named = dict(zip(sources, weights))
    try:
        mix = Mixture(sources, named, length=10)
    except ValueError as error:
        refused = re.fullmatch(r"mixture weight (.+) of source '(s\d)' \(stage at position 0\) rounds to 0: .+", str(error))
        assert refused is not None, str(error)
        assert named[refused[2]] > 0
        return
    period = sum(mix.definition.stages[0].quotas)
    progress = mix.progress(2 * period)
    for name, weight in named.items():
        assert (progress[name].draws > 0) == (weight > 0), (name, weight, progress[name])
