"""The arithmetic of a Mixture of streams read with in_order=False (mixtures/unordered_positions):
whatever pieces a run of positions is taken in, position `p` reads draw `d` of the source the
schedule gives it, a stream source's as item `d % T` of its source-epoch `d // T` (G2: each
source once per source-epoch, since a loader epoch's positions are its draws)."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_resume.mixtures.schedule import Schedule, parse_stages
from dist_resume.mixtures.unordered_positions import MixturePositions


class Source:
    """Reads `(source, source-epoch, index)` by index."""

    def __init__(self, source: int, epoch: int) -> None:
        self.key = (source, epoch)

    def take(self, start: int, count: int) -> list[tuple[int, int, int]]:
        return [(*self.key, index) for index in range(start, start + count)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), st.data())
def test_positions_read_the_draws_the_schedule_gives_them_in_any_pieces(lengths, data):
    names = [f"s{i}" for i in range(len(lengths))]
    weights = {name: data.draw(st.integers(0, 5)) for name in names}
    if not any(weights.values()):
        weights[names[0]] = 1
    schedule = Schedule(parse_stages(weights, names))
    streamed = [data.draw(st.booleans()) for _ in lengths]
    epoch_start = data.draw(st.integers(0, 50))
    total = data.draw(st.integers(1, 40))
    reader = MixturePositions(schedule, lengths, streamed, epoch_start, Source)
    cuts = sorted(data.draw(st.lists(st.integers(0, total), max_size=5)))
    taken = []
    for start, stop in itertools.pairwise([0, *cuts, total]):
        taken += reader.take(start, stop - start)
    sources, draws = schedule.assign(torch.arange(epoch_start, epoch_start + total))
    expected = [(source, *divmod(draw, lengths[source])) if streamed[source] else (source, -1, draw)
                for source, draw in zip(sources.tolist(), draws.tolist())]
    assert taken == expected
