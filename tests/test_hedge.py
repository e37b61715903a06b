"""The hedge race of one attempt (focus/backends/hedge.py), with scripted requests.

A unit test of one piece: each "request" is a coroutine that answers, fails or hangs
after a set time; the timer hedges after a fixed 50 ms. The HTTP client's hedging over a
real server is tested in tests/test_backends.py and tests/test_faults_model.py.
"""

from __future__ import annotations

import asyncio

import pytest

from focus.backends.hedge import race
from focus.backends.retry import HedgeTimer, HttpConfig
from focus.testing import run

KEY = ("/v1/completions", 4)


class Failed(Exception):
    hedged = 0


class Rejected(Exception):
    pass


def timer(copies: int = HedgeTimer.COPIES) -> HedgeTimer:
    t = HedgeTimer(HttpConfig(hedge_after_s=0.05))
    t.COPIES = copies
    return t


class Script:
    """Request ``i`` (0: the first, then each copy) does ``plan[i]`` = (seconds, outcome)."""

    def __init__(self, *plan: tuple[float, str]) -> None:
        self.plan = list(plan)
        self.started = 0
        self.cancelled: list[int] = []

    async def request(self) -> str:
        i = self.started
        self.started += 1
        seconds, outcome = self.plan[min(i, len(self.plan) - 1)]
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.cancelled.append(i)
            raise
        if outcome == "fail":
            raise Failed(f"request {i} failed")
        if outcome == "reject":
            raise Rejected(f"request {i} rejected")
        return f"answer {i}"

    def race(self, t: HedgeTimer | None = None):  # type: ignore[no-untyped-def]
        return race(self.request(), self.request, (), t or timer(), KEY, Failed)


def test_a_fast_first_request_sends_no_copy():
    s = Script((0.0, "ok"))
    assert run(s.race()) == ("answer 0", 0, None) and s.started == 1


def test_a_copy_that_answers_first_wins_and_the_first_request_is_cancelled():
    s = Script((5.0, "ok"), (0.0, "ok"))
    value, copies, waited = run(s.race())
    # the copy went out at the timer (50 ms; later on a loaded machine, whose loop wakes
    # late), not when the first request would have answered (5 s)
    assert (value, copies) == ("answer 1", 1) and 0.05 <= waited < 2.5
    assert s.cancelled == [0]


def test_when_the_first_request_fails_the_attempt_waits_for_its_copies():
    s = Script((0.1, "fail"), (0.2, "ok"), (5.0, "ok"))
    value, copies, _ = run(s.race())
    assert value == "answer 1" and copies == s.started - 1 >= 1  # later copies (hung) were cancelled


def test_a_failed_copy_makes_room_for_another_and_all_failing_raises_the_first_failure():
    s = Script((0.3, "fail"), (0.0, "fail"), (0.0, "fail"), (0.0, "fail"))
    with pytest.raises(Failed, match="request 0 failed") as err:
        run(s.race())
    assert err.value.hedged == s.started - 1 >= 2  # copies replaced each other while the first hung


def test_at_most_copies_requests_are_in_flight():
    s = Script((0.4, "ok"), (5.0, "ok"), (5.0, "ok"), (5.0, "ok"))
    value, copies, _ = run(s.race(timer(copies=3)))
    assert (value, copies) == ("answer 0", 2) and sorted(s.cancelled) == [1, 2]


def test_a_rejected_copy_ends_the_attempt_with_its_error():
    s = Script((5.0, "ok"), (0.0, "reject"))
    with pytest.raises(Rejected, match="request 1 rejected"):
        run(s.race())
    assert s.cancelled == [0]


def test_cancelling_the_caller_cancels_every_copy_and_is_not_swallowed():
    s = Script((5.0, "ok"), (5.0, "ok"))

    async def go() -> None:
        task = asyncio.ensure_future(s.race())
        await asyncio.sleep(0.15)  # a copy is in flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)

    run(go())
    assert s.started >= 2 and sorted(s.cancelled) == list(range(s.started))


def test_a_caller_cancelled_while_a_copy_wins_stays_cancelled():
    """The race cancels the caller's await when a copy wins; a cancellation from outside
    at the same moment must still reach the caller."""
    s = Script((5.0, "ok"), (0.0, "ok"))

    async def go() -> None:
        task = asyncio.ensure_future(s.race())
        await asyncio.sleep(0.049)
        while not s.started > 1:
            await asyncio.sleep(0)
        task.cancel()  # the copy answers in this same loop iteration
        with pytest.raises(asyncio.CancelledError):
            await task

    run(go())
