"""One timer for many requests in flight (focus/backends/watch.py), with scripted entries.

A unit test of one piece: entries are plain objects with start times; what the HTTP
client builds on it (read timeouts, hedge looks) is tested over real servers in
tests/test_backends.py and tests/test_hedge.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import cast

from focus.backends.watch import Entry, Watch
from focus.testing import run


def _entry(start: float) -> Entry:
    task = asyncio.current_task()
    assert task is not None
    return Entry(start, task)


def test_entries_fall_due_in_order_at_their_own_time_and_one_that_left_never_does():
    async def go() -> list[tuple[int, float]]:
        due: list[tuple[int, float]] = []
        t0 = time.monotonic()
        names: dict[Entry, int] = {}
        watch = Watch(asyncio.get_running_loop(), lambda: 0.05, lambda e: due.append((names[e], time.monotonic() - t0)))
        for i in range(3):
            e = _entry(time.monotonic())
            names[e] = i
            watch.add(e)
            if i == 1:
                watch.discard(e)  # answered before its time
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        assert len(watch) == 0
        return due

    due = run(go())
    assert [i for i, _ in due] == [0, 2]
    # each at its own start + 0.05 (entry 2 started about 0.04 s after entry 0); timers
    # never fire early, and a loaded machine may make them late
    assert due[0][1] >= 0.05 - 1e-3 and due[1][1] >= 0.09 - 1e-3 and due[1][1] > due[0][1]


class _Timers:
    """The loop as a Watch sees it, with the delay of every timer it arms recorded."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.delays: list[float] = []

    def call_later(self, delay: float, callback: Callable[[], object]) -> asyncio.TimerHandle:
        self.delays.append(delay)
        return self.loop.call_later(delay, callback)


def test_retime_moves_the_oldest_entry_to_a_shorter_wait():
    """Read from the timers the watch armed, not from when the entry fell due: a loaded
    machine runs a 0.02 s timer late (the test once bounded it by 0.2 s)."""

    async def go() -> tuple[list[float], float]:
        after = [10.0]
        fired: list[float] = []
        timers = _Timers(asyncio.get_running_loop())
        watch = Watch(
            cast(asyncio.AbstractEventLoop, timers), lambda: after[0], lambda e: fired.append(time.monotonic())
        )
        t0 = time.monotonic()
        watch.add(_entry(t0))
        after[0] = 0.02
        watch.retime()
        for _ in range(500):  # up to 5 s for a loaded machine; the 10 s timer was cancelled
            if fired:
                break
            await asyncio.sleep(0.01)
        assert fired, f"the entry never fell due after its wait was shortened (timers {timers.delays})"
        return timers.delays, fired[0] - t0

    delays, took = run(go())
    # armed for 10 s, then again for what is left of 0.02 s: not the 10 s it was armed for
    assert len(delays) == 2 and 10.0 - 0.5 < delays[0] <= 10.0 and 0 <= delays[1] <= 0.02, delays
    assert took >= 0.02 - 1e-3  # timers never fire early


def test_close_forgets_every_entry():
    async def go() -> int:
        fired: list[Entry] = []
        watch = Watch(asyncio.get_running_loop(), lambda: 0.01, fired.append)
        watch.add(_entry(time.monotonic()))
        watch.close()
        await asyncio.sleep(0.05)
        return len(fired) + len(watch)

    assert run(go()) == 0
