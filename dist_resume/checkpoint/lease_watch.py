"""Whether another job's writer lease is alive, judged by what this job sees change (G10).

A lease is alive once this job has seen its record change (a heartbeat, or a new generation
created), and stale once this job has seen it unchanged for the holder's stale period,
measured on this job's own clock. The times the record holds come from its writer's clock:
they never decide, they only let a refusal say when the two clocks disagree.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass

from dist_resume.checkpoint.lease_holder import Holder

CLOCK_TOLERANCE = 2.0  # seconds: clocks kept by NTP agree far better than this


@dataclass(frozen=True)
class Look:
    """One look at a run's newest lease: what was there, and when by this job's clocks."""

    sight: Hashable  # the newest generation and its bytes, None if there was no lease
    monotonic: float  # time.monotonic(): how long this job watched
    wall: float  # time.time(): only to compare with the record's own times


class Verdict(enum.Enum):
    TAKE = "take"  # create the next generation
    FORCE = "force"  # create it over a lease not shown free: DIST_RESUME_TAKE_OVER=1
    REFUSE = "refuse"  # another job is alive there
    WAIT = "wait"  # look again


class Watch:
    """The looks this job took at one run's lease, from its first."""

    def __init__(self, first: Look) -> None:
        self.first = first
        self.latest = first
        self.change: tuple[Look, Look] | None = None  # the looks before and after the latest change seen

    def see(self, look: Look) -> None:
        if look.sight != self.latest.sight:
            self.change = (self.latest, look)
        self.latest = look

    def verdict(self, holder: Holder | None, me: Holder, forced: bool) -> Verdict:
        """What to do about the latest look, whose record is ``holder`` (None: a record that
        names no job); ``forced``: DIST_RESUME_TAKE_OVER=1, which takes over the lease this
        job saw first, not one that another job created since."""
        if self.latest.sight is None:
            return Verdict.TAKE
        if holder is None or holder.released or holder.replaceable_by(me):
            return Verdict.TAKE
        if forced and self.latest.sight == self.first.sight:
            return Verdict.FORCE
        if self.change is not None:
            return Verdict.REFUSE
        if self.latest.monotonic - self.first.monotonic >= holder.stale_after:
            return Verdict.TAKE
        return Verdict.WAIT

    def seen_ago(self, now: float) -> float:
        """Seconds (this job's monotonic clock) since it saw the latest change; since its first look if none."""
        return now - (self.change[1] if self.change else self.first).monotonic

    def clock_note(self, recorded: float, stale_after: float) -> str:
        """What the heartbeat time a record holds says of its writer's clock, given that this
        job saw the record appear between its two looks around the change: "" if it could be
        this machine's time."""
        if self.change is None:
            return ""
        before, after = self.change
        if recorded > after.wall + CLOCK_TOLERANCE:
            return (f"; its recorded heartbeat time is {recorded - after.wall:.0f} s ahead of this machine's clock: "
                    "the clocks disagree, and this job judges a lease only by what it sees change")
        if recorded < before.wall - max(CLOCK_TOLERANCE, stale_after):
            return (f"; its recorded heartbeat time is {before.wall - recorded:.0f} s behind this machine's clock "
                    "(the clocks disagree, or the store showed the heartbeat late), and this job judges a lease "
                    "only by what it sees change")
        return ""
