"""One attempt with hedges: the first request in the caller's task, copies in tasks of their own.

When an attempt may be hedged (:class:`~focus.backends.retry.HedgeTimer` says when and
how often), the first request and its copies race and the first good answer wins. Most
attempts are never hedged - by design a copy goes out for about one request in a
thousand on a healthy server - so the race is built for that case: the first request
runs inline in the caller's task, and all the race costs it is an entry (:class:`Pending`)
in the client's :class:`~focus.backends.watch.Watch` of hedged requests of its latency
class (one timer for all of them; :class:`Hedges`), which is also the request's
read-timeout entry: only a request still unanswered at its race's first look
(``HedgeTimer.first_look_s``: the class's hedge delay) gets the race's state and timer
of its own (when the timer fires, a copy starts as a task).
A copy that answers first cancels the
caller's await of the first request (the connection it used is closed, like any
cancelled request) and its answer is returned instead; if the first request fails
while copies are in flight, the caller waits for them. Running the first request as a
task beside a waiter, as ``asyncio.wait`` does, cost about a tenth of bare aiohttp's
CPU per call (``python -m benchmarks.http_client``).

Rules kept from the timer: at most ``COPIES`` requests in flight per attempt (a copy
that failed makes room for another), copies spend the timer's budget (an ``OVERDUE``
request gets one anyway), a non-retryable failure of any copy (a 4xx) ends the attempt
with it, and when every request failed the first one's failure is the attempt's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

from focus.backends.retry import HedgeTimer
from focus.backends.watch import Entry, Watch

R = TypeVar("R")


class _Race(Generic[R]):
    """The copies of one attempt and what they did; callbacks run on the loop."""

    __slots__ = (
        "copies",
        "copy",
        "copy_args",
        "error",
        "first_failed",
        "handle",
        "interrupted",
        "key",
        "live",
        "loop",
        "over",
        "owner",
        "retryable",
        "sends",
        "timer",
        "waiter",
        "won",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        copy: Callable[..., Coroutine[Any, Any, R]],
        copy_args: tuple[Any, ...],
        timer: HedgeTimer,
        key: tuple[str, int],
        retryable: type[BaseException],
        owner: asyncio.Task[Any] | None,
        start: float,
    ) -> None:
        self.loop, self.copy, self.copy_args, self.timer = loop, copy, copy_args, timer
        self.key, self.retryable = key, retryable
        self.owner = owner
        self.sends = [start]
        self.copies: list[asyncio.Task[R]] = []
        self.live = 0  # copies in flight
        self.first_failed = False
        self.over = False
        #: What ended the race from a copy: (its result, its index) or its error.
        self.won: tuple[R, int] | None = None
        self.error: BaseException | None = None
        self.interrupted = False  # the owner's await was cancelled by the race
        self.waiter: asyncio.Future[None] | None = None
        self.handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """Look at hedging again when the newest request is due a copy (see ``_wait_s``)."""
        wait = self._wait_s()
        if wait is not None:
            self.handle = self.loop.call_later(wait, self.fire)

    def _wait_s(self) -> float | None:
        timer = self.timer
        if self.live + (not self.first_failed) >= timer.COPIES:
            return None
        delay = timer.delay(self.key)
        if delay is None:
            return timer.RECHECK_S
        now = time.monotonic()
        due = self.sends[-1] + delay - now
        if due > 0 or timer.can_spend():
            return max(0.0, due)
        return max(0.0, min(timer.RECHECK_S, self.sends[-1] + timer.OVERDUE * delay - now))

    def fire(self) -> None:
        self.handle = None
        if self.over:
            return
        timer = self.timer
        delay = timer.delay(self.key)
        waited = time.monotonic() - self.sends[-1]
        if (
            self.live + (not self.first_failed) < timer.COPIES
            and delay is not None
            and waited >= delay
            and timer.spend(overdue=waited >= timer.OVERDUE * delay)
        ):
            self.sends.append(time.monotonic())
            task = self.loop.create_task(self.copy(*self.copy_args))
            task.add_done_callback(self.copy_done)
            self.copies.append(task)
            self.live += 1
        self.arm()

    def copy_done(self, task: asyncio.Task[R]) -> None:
        self.live -= 1
        if task.cancelled():
            return
        exc = task.exception()  # retrieved: a copy's failure is never "unretrieved"
        if self.over:
            return
        if exc is None:
            self.won = (task.result(), self.copies.index(task) + 1)
        elif not isinstance(exc, self.retryable):
            self.error = exc
        elif not (self.first_failed and self.live == 0):
            if self.handle is None:
                self.arm()  # a failed copy makes room for another
            return
        self.end()

    def end(self) -> None:
        """A copy decided the attempt (or every request failed): tell the owner."""
        self.over = True
        if self.waiter is not None:
            if not self.waiter.done():
                self.waiter.set_result(None)
        elif self.owner is not None:
            self.interrupted = True
            self.owner.cancel()

    def close(self) -> None:
        self.over = True
        if self.handle is not None:
            self.handle.cancel()
        for task in self.copies:
            if not task.done():
                task.cancel()


class Hedges:
    """One client's hedged first requests on one loop: a :class:`Watch` per latency
    class, so that a request still unanswered ``timer.first_look_s(key)`` after its
    send - when a race armed at the send would first look at it - gets its race state,
    whose own timer then takes over. A class's first look is its hedge delay (or
    ``RECHECK_S`` while it has none); call :meth:`retime` when that delay changes."""

    __slots__ = ("loop", "timer", "watches")

    def __init__(self, loop: asyncio.AbstractEventLoop, timer: HedgeTimer) -> None:
        self.loop, self.timer = loop, timer
        self.watches: dict[tuple[str, int], Watch] = {}

    def watch(self, key: tuple[str, int]) -> Watch:
        watch = self.watches.get(key)
        if watch is None:
            timer = self.timer
            watch = self.watches[key] = Watch(self.loop, lambda: timer.first_look_s(key), _start_race)
        return watch

    def retime(self, key: tuple[str, int]) -> None:
        """The class's hedge delay changed: its oldest request's first look moves too."""
        watch = self.watches.get(key)
        if watch is not None:
            watch.retime()

    def close(self) -> None:
        for watch in self.watches.values():
            watch.close()


class Pending(Entry):
    """A first request that may be hedged: an :class:`Entry` with what its race needs
    (one object per request; its ``state`` is the race once one started)."""

    __slots__ = ("copy", "copy_args", "key", "retryable", "timer", "watch")

    def __init__(
        self,
        watch: Watch,
        owner: asyncio.Task[Any],
        copy: Callable[..., Coroutine[Any, Any, Any]],
        copy_args: tuple[Any, ...],
        timer: HedgeTimer,
        key: tuple[str, int],
        retryable: type[BaseException],
    ) -> None:
        super().__init__(time.monotonic(), owner, owner.cancelling())
        self.copy, self.copy_args, self.timer, self.key, self.retryable = copy, copy_args, timer, key, retryable
        self.watch = watch


def _start_race(entry: Entry) -> None:
    """The first look at a request that has not answered yet: what a race armed at its
    send would have done when its timer first fired."""
    assert isinstance(entry, Pending)
    task = entry.task
    state: _Race[Any] = _Race(
        task.get_loop(), entry.copy, entry.copy_args, entry.timer, entry.key, entry.retryable, task, entry.start
    )
    entry.state = state
    state.fire()


def enter(
    hedges: Hedges,
    copy: Callable[..., Coroutine[Any, Any, Any]],
    copy_args: tuple[Any, ...],
    key: tuple[str, int],
    retryable: type[BaseException],
) -> Pending:
    """A first request of the running task is being sent now: its entry in ``hedges``.
    Then await the request and end with :func:`answered` or :func:`failed`."""
    owner = asyncio.current_task()
    assert owner is not None, "a hedged request runs in a task"
    watch = hedges.watch(key)
    entry = Pending(watch, owner, copy, copy_args, hedges.timer, key, retryable)
    watch.add(entry)
    return entry


def answered(entry: Pending) -> int:
    """The first request answered: the copies sent beside it (their requests cancelled)."""
    entry.watch.discard(entry)
    state = entry.state
    if state is None:
        return 0
    state.over = True
    state.close()
    return len(state.copies)


async def failed(entry: Pending, error: BaseException) -> tuple[Any, int, float | None]:
    """The first request raised ``error``: a copy's answer (the value, the copies sent,
    how long the first request had waited until that copy was sent), or an error."""
    entry.watch.discard(entry)
    state = entry.state
    try:
        if isinstance(error, asyncio.CancelledError):
            if state is None or not state.interrupted or entry.task.uncancel() > 0:
                raise error  # cancelled from outside (too)
            return _outcome(state)
        if not isinstance(error, entry.retryable):
            raise error
        if state is None:  # failed before its first look: no copies
            error.hedged = 0  # type: ignore[attr-defined]
            raise error
        state.first_failed = True
        if state.live == 0 or state.over:
            if not state.over:
                error.hedged = len(state.copies)  # type: ignore[attr-defined]
                raise error
            return _outcome(state)
        state.waiter = state.loop.create_future()
        if state.handle is None:
            state.arm()
        await state.waiter
        if state.won is None and state.error is None:
            error.hedged = len(state.copies)  # type: ignore[attr-defined]
            raise error
        return _outcome(state)
    finally:
        if state is not None:
            state.close()


async def race(
    first: Awaitable[R],
    copy: Callable[..., Coroutine[Any, Any, R]],
    copy_args: tuple[Any, ...],
    timer: HedgeTimer,
    key: tuple[str, int],
    retryable: type[BaseException],
    hedges: Hedges | None = None,
) -> tuple[R, int, float | None]:
    """The first good answer of the request ``first`` (not yet awaited) and its hedges
    (``copy(*copy_args)``, each a new request): the answer, the copies sent, and - when a
    copy answered - how long the first request had waited until that copy was sent
    (None when the first answered). Raises the first request's failure when every
    request failed (its ``hedged`` attribute set to the copies sent), or a copy's
    non-``retryable`` error. ``hedges``: the client's :class:`Hedges` on this loop
    (None: its own). The HTTP client runs these same steps inline (:func:`enter`,
    :func:`answered`, :func:`failed`), one coroutine fewer per call."""
    if hedges is None:
        hedges = Hedges(asyncio.get_running_loop(), timer)
    entry = enter(hedges, copy, copy_args, key, retryable)
    try:
        value = await first
    except BaseException as e:
        return await failed(entry, e)
    return value, answered(entry), None


def _outcome(state: _Race[Any]) -> tuple[Any, int, float | None]:
    if state.error is not None:
        raise state.error
    assert state.won is not None
    value, index = state.won
    return value, len(state.copies), state.sends[index] - state.sends[0]
