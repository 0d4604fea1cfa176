"""The composition of a stage by real tokens (`mixtures/token_pacing.py`, hypothesis): the
positions' sources are the order of the draws' keys, found by search at any position as by
walking forward; each source's real tokens stay within `(1 + w_s (S - 2)) W / 2` of its share
at every position (half a sequence for two sources), within twice that over any window."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.mixtures.schedule import Schedule, Stage
from dist_resume.mixtures.token_pacing import TokenStage, token_bound

WIDTH = 9


class ListedDraws:
    """Draws holding `tokens[d % len]` real tokens each, every source-epoch alike."""

    def __init__(self, tokens: list[int]) -> None:
        self.width = WIDTH
        self._cumulative = numpy.concatenate([[0], numpy.cumsum(tokens)]).astype(numpy.int64)
        self._epoch = int(self._cumulative[-1])
        self.average = self._epoch / len(tokens)

    def before(self, draws: numpy.ndarray) -> numpy.ndarray:
        epochs, within = numpy.divmod(draws, len(self._cumulative) - 1)
        return epochs * self._epoch + self._cumulative[within]

    def before_one(self, draw: int) -> int:
        return int(self.before(numpy.array([draw]))[0])


def walked(quotas, offsets, draws, count):
    """The first `count` positions by the rule itself: each takes the smallest key (the
    lower source on a tie), keys `(C(d) + C(d + 1) - 2 C(offset)) / q`."""
    taken = [0] * len(quotas)
    order = []
    for _ in range(count):
        def key(source):
            tokens, first = draws[source], offsets[source] + taken[source]
            return (Fraction(tokens.before_one(first) + tokens.before_one(first + 1) - 2 * tokens.before_one(
                offsets[source]), quotas[source]), source)
        source = min((s for s, quota in enumerate(quotas) if quota), key=key)
        order.append(source)
        taken[source] += 1
    return order


token_lists = st.lists(st.integers(1, WIDTH), min_size=1, max_size=12)
sources = st.integers(2, 4).flatmap(lambda count: st.tuples(
    st.lists(st.integers(0, 7), min_size=count, max_size=count).filter(any),
    st.lists(token_lists, min_size=count, max_size=count),
    st.lists(st.integers(0, 30), min_size=count, max_size=count)))


@settings(max_examples=150, deadline=None)
@given(sources, st.integers(1, 120), st.data())
def test_positions_take_the_draws_in_key_order_by_search_or_walk(drawn, length, data) -> None:
    quotas, token_lists_, offsets = drawn
    draws = [ListedDraws(tokens) for tokens in token_lists_]
    expected = walked(quotas, offsets, draws, length)
    stage = TokenStage(quotas, offsets, draws)
    sources, numbers = stage.assign_array(numpy.arange(length, dtype=numpy.int64))
    assert sources.tolist() == expected
    for source in range(len(quotas)):
        assert numbers[sources == source].tolist() == list(range(expected.count(source)))
    # any position found by search (a fresh stage) and by walking (the same stage) agrees
    n = data.draw(st.integers(0, length))
    assert TokenStage(quotas, offsets, draws).counts(n) == [expected[:n].count(s) for s in range(len(quotas))]
    assert stage.counts(n) == [expected[:n].count(s) for s in range(len(quotas))]
    # positions out of order, with repeats
    picked = data.draw(st.lists(st.integers(0, length - 1), max_size=20))
    got, _ = TokenStage(quotas, offsets, draws).assign_array(numpy.array(picked, dtype=numpy.int64))
    assert got.tolist() == [expected[p] for p in picked]


@settings(max_examples=150, deadline=None)
@given(sources, st.integers(1, 300))
def test_every_source_stays_within_its_token_bound_at_every_position_and_window(drawn, length) -> None:
    quotas, token_lists_, offsets = drawn
    draws = [ListedDraws(tokens) for tokens in token_lists_]
    order, _ = TokenStage(quotas, offsets, draws).assign_array(numpy.arange(length, dtype=numpy.int64))
    taken = [0] * len(quotas)
    totals = [[0] * len(quotas)]  # every source's real tokens after each position
    for source in order.tolist():
        tokens = draws[source]
        first = offsets[source] + taken[source]
        gained = tokens.before_one(first + 1) - tokens.before_one(first)
        taken[source] += 1
        totals.append([value + (gained if s == source else 0) for s, value in enumerate(totals[-1])])
    share = [Fraction(quota, sum(quotas)) for quota in quotas]
    for source in range(len(quotas)):
        bound = token_bound(quotas, source, WIDTH)
        assert bound <= (len([q for q in quotas if q]) - 1) * WIDTH / 2
        for before, after in itertools.combinations(totals, 2):
            mine, every = after[source] - before[source], sum(after) - sum(before)
            assert abs(mine - share[source] * every) <= 2 * bound
        for after in totals:
            assert abs(after[source] - share[source] * sum(after)) <= bound


def test_two_sources_stay_within_half_a_sequence() -> None:
    assert token_bound([7, 3], 0, 2049) == token_bound([7, 3], 1, 2049) == Fraction(2049, 2)
    assert token_bound([1, 1, 2], 2, 10) == Fraction(15, 2)
    assert token_bound([1, 0], 1, 10) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.lists(st.integers(0, 5), min_size=3, max_size=3).filter(any)),
                min_size=1, max_size=4), st.lists(token_lists, min_size=3, max_size=3))
def test_stages_continue_each_source_where_it_was(spans_and_quotas, token_lists_) -> None:
    draws = [ListedDraws(tokens) for tokens in token_lists_]
    start, stages = 0, []
    for span, quota in spans_and_quotas:
        stages.append(Stage(start, tuple(quota)))
        start += span
    schedule = Schedule(stages, draws)
    length = start + 10
    sources, numbers = schedule.assign(torch.arange(length))
    for source in range(3):
        mine = numbers[sources == source].tolist()
        assert mine == list(range(len(mine)))
        assert schedule.draws_before(length)[source] == len(mine)
    # each stage is the walk of its quotas from the draws before it
    for index, stage in enumerate(stages):
        end = stages[index + 1].start if index + 1 < len(stages) else length
        offsets = Schedule(stages, draws).draws_before(stage.start)
        assert sources[stage.start:end].tolist() == walked(stage.quotas, offsets, draws, end - stage.start)
