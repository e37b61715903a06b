"""Requests in flight, oldest first, under one timer: timeouts and hedge looks without a timer each.

A collection keeps 64-256 calls in flight, and each used to arm two event-loop timers
of its own - its read timeout (``asyncio.timeout``) and its hedge race's first look -
only to cancel both when it answered, a few milliseconds later. Every timer is a
handle pushed onto the loop's heap and popped again, compared in Python on the way;
with the ``asyncio.Timeout`` object and the race state around them they were about
half of what the client added to bare aiohttp per call (``python -m
benchmarks.http_client``).

A :class:`Watch` holds the requests that are due at ``start + after`` for one
``after`` common to all of them (the client's ``timeout_s``; the hedge delay of a
latency class). Then the order in which they were sent is the order in which they fall due, so
an insertion-ordered dict is the queue, entering and leaving are a dict insert and
delete, and one timer for the oldest suffices: when it fires, the entries that are
due are handed to ``on_due`` and the timer is set again for the oldest that is not.
An entry that left before its time costs nothing; the timer finds the next one.
What falls due when is exactly what a timer per request would give.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


class Entry:
    """One request in flight: when it was sent and the task awaiting it.

    ``cancelling``: the task's pending cancellations when it entered (so that a
    timeout can tell its own cancellation from one from outside, as ``asyncio.timeout``
    does); ``expired``: the watch cancelled the task (a timeout); ``state``: what
    ``on_due`` made of it (a hedge race), for the task to find when it resumes.
    """

    __slots__ = ("cancelling", "expired", "start", "state", "task")

    def __init__(self, start: float, task: asyncio.Task[Any], cancelling: int = 0) -> None:
        self.start, self.task, self.cancelling = start, task, cancelling
        self.expired = False
        self.state: Any = None


class Watch:
    """Entries due ``after()`` seconds past their start, in the order they entered;
    ``on_due(entry)`` runs on the loop for each once its time has come (unless it
    left first). ``after`` is read when the timer is set, and must be the same for
    every entry at any one time; when it changes, :meth:`retime`."""

    __slots__ = ("_entries", "_handle", "after", "loop", "on_due")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, after: Callable[[], float], on_due: Callable[[Entry], None]
    ) -> None:
        self.loop, self.after, self.on_due = loop, after, on_due
        self._entries: dict[Entry, None] = {}
        self._handle: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, entry: Entry) -> None:
        self._entries[entry] = None
        if self._handle is None:
            self._arm(entry, time.monotonic())

    def oldest(self) -> float | None:
        """When the oldest entry still watched was sent (None: none)."""
        return next(iter(self._entries)).start if self._entries else None

    def discard(self, entry: Entry) -> None:
        self._entries.pop(entry, None)

    def retime(self) -> None:
        """``after`` changed: set the timer again for the oldest entry."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._entries:
            self._arm(next(iter(self._entries)), time.monotonic())

    def _arm(self, entry: Entry, now: float) -> None:
        self._handle = self.loop.call_later(max(0.0, entry.start + self.after() - now), self._fire)

    def _fire(self) -> None:
        self._handle = None
        entries = self._entries
        now = time.monotonic()
        after = self.after()
        while entries:
            entry = next(iter(entries))
            if entry.start + after > now:
                self._arm(entry, now)
                return
            del entries[entry]
            self.on_due(entry)

    def close(self) -> None:
        """Forget every entry and the timer (the loop is ending, or the client closing)."""
        self._entries.clear()
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
