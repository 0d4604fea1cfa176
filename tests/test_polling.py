"""The demo jobs' one wait: what it returns, raises and passes on."""

from __future__ import annotations

import pytest

from dist_resume.demo.job import JobError
from dist_resume.demo.polling import poll_until


def test_it_returns_at_the_look_that_finds_it_done() -> None:
    looks = iter([False, False, True])
    seen = []

    def done() -> bool:
        seen.append(1)
        return next(looks)

    poll_until(done, 60, lambda: JobError("never"), 0)
    assert len(seen) == 3


def test_past_its_deadline_it_raises_what_timed_out_gives() -> None:
    with pytest.raises(JobError, match="^not yet$"):
        poll_until(lambda: False, 0, lambda: JobError("not yet"), 0)


def test_an_error_raised_by_done_fails_the_wait_at_once() -> None:
    def done() -> bool:
        raise JobError("the group exited")

    with pytest.raises(JobError, match="^the group exited$"):
        poll_until(done, 60, lambda: JobError("never"), 0)
