"""B2, mixture row: time to the first batch after resuming part-way through a
10,000,000-position mixture of three sources with a three-stage weight schedule."""

from __future__ import annotations

from dist_resume import Mixture

from .b2_resume import BATCH, first_batch, make, ours_state_at
from .report import FigureResult
from .timing import interleaved
from .workloads import OURS, TinyDataset

LENGTH = 10_000_000
POSITIONS = (0.0, 0.5, 0.99)
STAGES = [
    (0, {"web": 0.6, "code": 0.3, "books": 0.1}),
    (4_000_000, {"web": 0.5, "code": 0.3, "books": 0.2}),
    (9_000_000, {"web": 0.2, "code": 0.3, "books": 0.5}),
]


def mixture() -> Mixture:
    return Mixture({"web": TinyDataset(6_000_000), "code": TinyDataset(3_000_000), "books": TinyDataset(1_000_000)},
                   STAGES, LENGTH)


def run(quick: bool) -> list[FigureResult]:
    result = FigureResult("B2-mixture", f"time to first batch, {LENGTH:,}-position 3-source mixture, 3 stages, "
                          f"batch {BATCH} (lower is better)", "s", log_scale=True)
    mix = mixture()
    reps = 10 if quick else 60
    total = LENGTH // BATCH
    cases = {"fresh": lambda: first_batch(make(OURS, mix))}
    for fraction in POSITIONS:
        state = ours_state_at(mix, int(fraction * total))
        cases[f"resume at {fraction:.0%}"] = lambda state=state: first_batch(make(OURS, mix), state)
    stats = interleaved(cases, reps)
    for case, value in stats.items():
        result.add(case, OURS, value)
    for fraction in POSITIONS:
        case = f"resume at {fraction:.0%}"
        ratio = stats[case].median / stats["fresh"].median
        result.check(f"{case}: vs fresh epoch", ratio, "<= 1.1", ratio <= 1.1)
    result.notes += [
        "Shuffled sources of 6M, 3M and 1M samples (sample i is the int i), stages from positions 0, 4M, 9M; "
        "each measurement builds a new loader and times load_state_dict + iter() + the first batch "
        "(num_workers=0); states built as in B2.",
    ]
    return [result]
