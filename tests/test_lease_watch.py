"""Clock-free staleness (issue 33, G10): whether another job's lease is alive is decided by
what this job sees change, over its own clock, never by the times the record holds (another
machine's clock); those only let a refusal say by how much the clocks disagree. Hypothesis
over sequences of looks, records and clocks."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from dist_resume.checkpoint.lease_holder import Holder
from dist_resume.checkpoint.lease_watch import CLOCK_TOLERANCE, Look, Verdict, Watch

ME = Holder("a" * 32, "this-host", 1, "", 0.0, 0.0, 30.0)
THEM = Holder("b" * 32, "another-host", 2, "", 0.0, 0.0, 30.0)
times = st.floats(-1e12, 1e12, allow_nan=False)


def _verdicts(refresh: float, looks: list[tuple[float, bool]], recorded: list[float], forced: bool,
              released_at: int | None) -> list[Verdict]:
    """This job's verdict after each look; look i comes ``looks[i][0]`` s after the previous
    one, and finds the record changed (its next heartbeat) if ``looks[i][1]``."""
    holder = replace(THEM, refresh_seconds=refresh, heartbeat_at=recorded[0])
    monotonic, watch, verdicts = 0.0, None, []
    for i, (elapsed, changed) in enumerate(looks):
        monotonic += elapsed
        if i and changed:
            holder = replace(holder, beat=holder.beat + 1, heartbeat_at=recorded[holder.beat + 1])
        if released_at is not None and i >= released_at:
            holder = replace(holder, released=True)
        look = Look(("7", holder.encode()), monotonic, 1.7e9 + monotonic)
        if watch is None:
            watch = Watch(look)
        else:
            watch.see(look)
        verdicts.append(watch.verdict(holder, ME, forced))
    return verdicts


looks = st.lists(st.tuples(st.floats(0, 100), st.booleans()), min_size=1, max_size=40)


@given(refresh=st.floats(0.01, 100), looks=looks, first=st.lists(times, min_size=41, max_size=41),
       second=st.lists(times, min_size=41, max_size=41), forced=st.booleans(),
       released_at=st.none() | st.integers(0, 40))
def test_a_lease_is_judged_by_what_this_job_sees_change_never_by_its_recorded_times(
        refresh: float, looks: list[tuple[float, bool]], first: list[float], second: list[float], forced: bool,
        released_at: int | None) -> None:
    verdicts = _verdicts(refresh, looks, first, forced, released_at)
    assert verdicts == _verdicts(refresh, looks, second, forced, released_at)  # whatever its clock says
    clock, changed, first_sight_kept = 0.0, False, True
    for i, ((elapsed, change), verdict) in enumerate(zip(looks, verdicts)):
        clock += elapsed
        released = released_at is not None and i >= released_at
        changed = changed or (i > 0 and (change or released_at == i))
        first_sight_kept = first_sight_kept and not (i > 0 and (change or released_at == i))
        if released:
            expected = Verdict.TAKE
        elif forced and first_sight_kept:
            expected = Verdict.FORCE
        elif changed:
            expected = Verdict.REFUSE
        elif clock - looks[0][0] >= 4 * refresh:  # watched that long, by this job's clock
            expected = Verdict.TAKE
        else:
            expected = Verdict.WAIT
        assert verdict == expected, (i, verdict, expected)


@given(before=st.floats(0, 1e10), gap=st.floats(0, 1e4), recorded=st.floats(-1e11, 1e11),
       stale_after=st.floats(0.04, 400))
def test_a_refusal_says_how_far_the_record_s_clock_is_from_this_one(before: float, gap: float, recorded: float,
                                                                   stale_after: float) -> None:
    """The record changed between two looks at wall times ``before`` and ``before + gap``."""
    after = before + gap
    watch = Watch(Look(("1", b"a"), 0.0, before))
    assert watch.clock_note(recorded, stale_after) == ""  # nothing seen change: nothing to say
    watch.see(Look(("1", b"b"), gap, after))
    note = watch.clock_note(recorded, stale_after)
    if recorded > after + CLOCK_TOLERANCE:
        assert note == (f"; its recorded heartbeat time is {recorded - after:.0f} s ahead of this machine's clock: "
                        "the clocks disagree, and this job judges a lease only by what it sees change")
    elif recorded < before - max(CLOCK_TOLERANCE, stale_after):
        assert note == (f"; its recorded heartbeat time is {before - recorded:.0f} s behind this machine's clock "
                        "(the clocks disagree, or the store showed the heartbeat late), and this job judges a lease "
                        "only by what it sees change")
    else:
        assert note == ""
