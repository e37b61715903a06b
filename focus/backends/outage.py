"""Waiting out a model service that does not answer: one gate per client and event loop.

Model servers restart: a crash, a weights reload, a node drain, a rolling update. vLLM
and SGLang take from 30 s to a few minutes to come back (loading weights, compiling,
warming up), and until then every request is refused or reset, or answered 502, 503 or
504 by the proxy in front of them. A client's ordinary retries span about 10 s; past
them, failing every rollout in flight would fail the collection. Instead, the calls
wait at the client's :class:`OutageGate` for up to ``RetryPolicy.outage_wait_s``,
counted from the first failure after the service's last good answer:

* while the service is down, one waiting call tries again about every ``probe_s``
  (a probe is the call's own request, so it works with any server and any proxy, and
  "up" means what the collection needs: a generation answered);
* the first good answer - a probe's or any other call's - opens the gate, and every
  waiting call tries again at once, with its retries counted afresh;
* one log line says what is waited for, and one that the service is back;
* past the window, the waiting calls fail as every call failed before (the client's
  ``unavailable`` error, which fails the wave as a model-service outage).

Which failures enter the gate: a call whose ordinary retries ran out or grew longer
than a probe interval (about 1.3 s of failures with the default backoff, or at once when
the answer's ``Retry-After`` asks for longer), with a connection failure or a
429/502/503/504 as the last cause, while no request sent since the call's first failure
has been answered (the service is down, not this request). A rate limit (429) is waited
for as an outage: a gateway in front of the model that throttles every request for a
minute or more failed every call after its ten retries (``Retry-After`` was honoured up
to ``backoff_max_s`` only), and the collection stopped as if the service were gone. The
gate honours a ``Retry-After`` up to the window's end: no probe goes before it. Once calls
are waiting, any retryable failure of another call (a timeout, any 5xx) joins them
rather than spending its own retries. A malformed answer is an answer and never waits.
The same holds for a service that is not up yet when the collection starts (a server
still loading its weights): it is waited for like a restart, and the log line names
the URL. The ``focus`` command first connects to the URL once
(:func:`focus.backends.reach.first_contact`), so one that nothing answers in this run
(a wrong port or host) fails in seconds instead of after the whole window.

The decisions (:meth:`OutageGate.should_wait`, when a probe is due, when the window
ends) are plain arithmetic on times the caller passes; the gate's only I/O is the
log lines, and its only asyncio object the event waiting calls sleep on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: Statuses that say the service (or the proxy in front of it) takes no request right
#: now: not there (502, 503, 504), or over a rate limit (429: a gateway's, for every
#: request alike, often for longer than the quick retries - a minute's quota spent).
DOWN_STATUSES = frozenset({429, 502, 503, 504})
#: A rate limit's status: the lines name it, and its ``Retry-After`` spaces the probes.
RATE_LIMITED = 429
#: Marks a log record for the ``focus`` command's console in quiet mode (the command's
#: logging setup shows records carrying this attribute; elsewhere it is ignored).
CONSOLE = {"focus_console": True}

#: Servers (``host:port``) whose owner starts them again itself when they die, and says
#: so in a line of its own: the embedded model server while its keeper runs
#: (:meth:`focus.backends.local.LocalModelServer.keep_alive`, :func:`kept_by_owner`). A
#: gate's lines about such a server go to the log file alone: ``focus train`` with its
#: server killed printed three lines for one restart (the keeper's, then the client's
#: "has not answered" and "answers again"). An outage of any other server (vLLM, an
#: embedded server another process started) is reported as before. Per process: Dask
#: workers of ``--dask`` do not know the command's keeper, and report as before.
_KEPT: set[str] = set()


def _server(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).netloc.lower()


def kept_by_owner(url: str, kept: bool = True) -> None:
    """Mark the server at ``url`` as one its owner restarts and reports itself
    (``kept=False``: no more); see :data:`_KEPT`."""
    (_KEPT.add if kept else _KEPT.discard)(_server(url))


def _for(url: str) -> dict[str, Any]:
    """``extra=`` for a gate's line about ``url``: the console's mark, unless its owner
    reports its restarts (:data:`_KEPT`)."""
    return {} if _server(url) in _KEPT else CONSOLE


#: What :meth:`OutageGate.wait` returns: the service answered (retry with fresh retries) ...
UP = "up"
#: ... it is this call's turn to probe (retry once, then wait again) ...
PROBE = "probe"
#: ... or the window (or the call's deadline) has passed (give up).
OVER = "over"


def span(seconds: float) -> str:
    """A duration for a log line or an error: whole seconds from 10 s up, one decimal
    below (at most), ``under 0.1 s`` below that. Rounded to whole seconds, the waits of a
    client whose retries are quick read "for 0 s", which says nothing happened."""
    if seconds < 0.05:
        return "under 0.1 s"
    if seconds >= 9.95:
        return f"{seconds:.0f} s"
    return f"{seconds:.1f}".rstrip("0").rstrip(".") + " s"


@dataclass
class OutageTotals:
    """Outages of a client's service waited out, and the seconds they lasted (from
    the first failure to the first answer), over every event loop the client used."""

    outages: int = 0
    outage_s: float = 0.0
    #: Times the service answered again after failures that a restart gives (no answer,
    #: or 502/503/504), waited out or not: a server started again may serve other
    #: weights, which its client asks about before it records the next answer
    #: (:meth:`focus.backends.http_policy.HttpPolicy.weights_said`). Not in :meth:`as_dict`.
    comebacks: int = 0

    def as_dict(self) -> dict[str, float]:
        return {"outages": self.outages, "outage_s": round(self.outage_s, 3)}


class OutageGate:
    """The outage state of one client's service on one event loop (see module docs)."""

    #: Seconds between probes while the service is down (less if the retry policy's
    #: ``backoff_max_s`` is shorter): a call returns within about this long after the
    #: service is back, and a service coming up is asked about once a second.
    PROBE_S = 1.0

    def __init__(
        self,
        window_s: float,
        *,
        service: str,
        url: str,
        probe_s: float | None = None,
        totals: OutageTotals | None = None,
    ) -> None:
        self.window_s = window_s
        self.service, self.url = service, url
        self.probe_s = self.PROBE_S if probe_s is None else max(0.01, min(self.PROBE_S, probe_s))
        #: When the last request that got a good answer was sent (monotonic; an answer
        #: read after a failure may have been sent before it); None: none in this process.
        self.last_ok: float | None = None
        #: Monotonic time of the first failure since the last good answer (None: up).
        self.down_since: float | None = None
        #: Whether calls are waiting (the outage was announced).
        self.waiting = False
        #: Outages waited out and the seconds they lasted (the client's, if it passed them).
        self.totals = totals if totals is not None else OutageTotals()
        #: When the last good answer was read (monotonic; None: none yet in this process).
        self.last_answer: float | None = None
        #: Since when the silence was warned about (None: no warning standing).
        self.silent_since: float | None = None
        #: When requests were first seen waiting with no answer since (the silence watch's).
        self._waiting_since: float | None = None
        #: Calls in the backoff between attempts (no request in flight): when each began.
        self._backing_off: dict[object, float] = {}
        #: The last failure a call backs off from, and its status (None: no answer).
        self._last_failure: tuple[str, int | None] = ("", None)
        self._next_probe = 0.0
        #: The status of the last failed attempt (None: no answer): a rate limit's is named.
        self._status: int | None = None
        #: Whether a failure since the last good answer is one a restart gives (no answer,
        #: 502/503/504): the next good answer counts as a comeback (:attr:`OutageTotals.comebacks`).
        self._lost = False
        #: Whether a rate limit's line was given (once per gate: a gateway admitting a
        #: share of the calls ends each wait, and the next 429 begins another).
        self._throttled = False
        #: This wait is a rate limit's after its line was given: no lines for it.
        self._quiet = False
        self._up = asyncio.Event()
        self._up.set()

    # ---- events (cheap: every call reports its outcome) ----

    def answered(self, sent: float, now: float) -> None:
        """A good answer to a request sent at ``sent``: the service is up, unless the
        request went out before the outage began (its answer may be read after the
        server died); wake every waiting call."""
        if self.last_ok is None or sent > self.last_ok:
            self.last_ok = sent
        self.last_answer = now
        if self.silent_since is not None:
            self._heard(now)
        if self.down_since is None or sent < self.down_since:
            return
        if self.waiting or self._lost:
            self.totals.comebacks += 1
        if self.waiting:
            self.totals.outages += 1
            self.totals.outage_s += now - self.down_since
            if not self._quiet:
                log.warning(
                    "%s at %s answers again after %s; the waiting rollouts go on",
                    self.service,
                    self.url,
                    span(now - self.down_since),
                    extra=_for(self.url),
                )
        self.down_since, self.waiting, self._quiet, self._lost = None, False, False, False
        self._up.set()

    def failed(self, now: float, retry_after: float | None = None, status: int | None = None) -> None:
        """A failed attempt (any retryable cause; its ``status``, where it was answered):
        no probe goes before its ``Retry-After`` (``retry_after`` seconds from ``now``)."""
        if self.down_since is None:
            self.down_since = now
            self._up.clear()
        if retry_after:
            self._next_probe = max(self._next_probe, now + retry_after)
        self._status = status
        if status is None or (status in DOWN_STATUSES and status != RATE_LIMITED):
            self._lost = True

    @contextlib.contextmanager
    def backing_off(self, began: float, cause: str, status: int | None) -> Iterator[None]:
        """A call that began at ``began`` waits out its backoff after ``cause``: it
        counts as waiting for the silence watch (a service answering 429 to every
        request keeps no request in flight)."""
        token = object()
        self._backing_off[token] = began
        self._last_failure = (cause, status)
        try:
            yield
        finally:
            del self._backing_off[token]

    def waiting_calls(self, in_flight: int, oldest: float | None) -> tuple[int, float | None]:
        """The calls waiting for an answer: ``in_flight`` requests (the ``oldest`` sent
        then) and those backing off; when the oldest of them began."""
        starts = [t for t in (oldest, *self._backing_off.values()) if t is not None]
        return in_flight + len(self._backing_off), min(starts, default=None)

    def look(self, now: float, waiting: int, oldest: float | None, after_s: float, timeouts: str) -> None:
        """The silence watch's look (every ``after_s / 4``, :func:`watch_silence`):
        ``waiting`` requests in flight, the ``oldest`` sent at that time. Once no answer
        has come for ``after_s`` while requests wait, one warning line (and one when an
        answer comes again); nothing while answers flow or nothing waits."""
        if not waiting or oldest is None:
            self._waiting_since = None
            return
        if self._waiting_since is None:
            self._waiting_since = oldest
        quiet = max(self._waiting_since, self.last_answer if self.last_answer is not None else oldest)
        if self.silent_since is None and now - quiet >= after_s:
            self.silent_since = quiet
            cause, status = self._last_failure
            if status is not None and self._backing_off:  # the service answers, but nothing usable
                log.warning(
                    "no usable answer has come from the %s at %s for %s; %d request(s) wait, retried after "
                    "each answer (the last: status %d: %s; silence_warn_s = %g s; %s)",
                    self.service,
                    self.url,
                    span(now - quiet),
                    waiting,
                    status,
                    cause,
                    after_s,
                    timeouts,
                    extra=CONSOLE,
                )
                return
            log.warning(
                "no answer has come from the %s at %s for %s; %d request(s) wait (silence_warn_s = %g s; %s)",
                self.service,
                self.url,
                span(now - quiet),
                waiting,
                after_s,
                timeouts,
                extra=CONSOLE,
            )

    def _heard(self, now: float) -> None:
        assert self.silent_since is not None
        log.warning(
            "%s at %s answers again after %s without an answer",
            self.service,
            self.url,
            span(now - self.silent_since),
            extra=CONSOLE,
        )
        self.silent_since = self._waiting_since = None

    def throttled(self, cause: str) -> None:
        """A call refused by a rate limit (429) past its retries while others are answered
        retries on (``HttpClient._next_wait``): one warning line for the client, not one
        per call."""
        if self._throttled:
            return
        self._throttled = True
        log.warning(
            "%s at %s answers some requests with status 429 (rate limited) again and again (%s); each such call "
            "retries past its max_retries, up to %g s from its first failure (outage_wait_s), waiting as its "
            "Retry-After asks",
            self.service,
            self.url,
            cause,
            self.window_s,
            extra=CONSOLE,
        )

    # ---- decisions ----

    def should_wait(self, *, streak_start: float, retries_left: bool, down_cause: bool) -> bool:
        """Whether a call that just failed waits for the service instead of retrying on
        its own or giving up. ``streak_start``: when the call's current run of failures
        began; ``retries_left``: whether it would still retry on its own soon (its
        ordinary retries are not spent and its next backoff is shorter than a probe
        interval: past that, a call waiting here goes on sooner once the service is back);
        ``down_cause``: whether its failure says the service is not there (refused,
        reset, 502/503/504) rather than something else retryable."""
        if self.window_s <= 0:
            return False
        if self.last_ok is not None and self.last_ok >= streak_start:
            return False  # others were answered meanwhile: the service is up, this request fails
        if self.waiting:
            return True
        return down_cause and not retries_left

    def window_end(self) -> float:
        """When waiting stops: ``window_s`` after the first failure of the outage."""
        return (self.down_since if self.down_since is not None else time.monotonic()) + self.window_s

    async def wait(self, deadline: float | None, cause: str) -> str:
        """Sleep until this call should try again: :data:`UP` (another call was answered),
        :data:`PROBE` (this call's turn to try), or :data:`OVER` (the window or the
        call's ``deadline`` has passed). ``cause``: the last failure, for the log line."""
        self._announce(cause)
        end = self.window_end()
        if deadline is not None:
            end = min(end, deadline)
        while True:
            if self.down_since is None:
                return UP
            now = time.monotonic()
            if now >= end:
                return OVER
            if self._next_probe <= now:
                self._next_probe = now + self.probe_s
                return PROBE
            try:
                async with asyncio.timeout(min(self._next_probe, end) - now):
                    await self._up.wait()
            except TimeoutError:
                continue
            return UP

    def _announce(self, cause: str) -> None:
        if self.waiting:
            return
        self.waiting = True
        since = self.down_since if self.down_since is not None else time.monotonic()
        if self._status == RATE_LIMITED:
            self._quiet, self._throttled = self._throttled, True
            if self._quiet:
                return
            log.warning(
                "%s at %s has answered every request with status 429 (rate limited) for %s (%s); waiting up to %g s "
                "from then for it to take requests again (outage_wait_s), asking again when its Retry-After says; "
                "rollouts in flight wait too",
                self.service,
                self.url,
                span(time.monotonic() - since),
                cause,
                self.window_s,
                extra=CONSOLE,
            )
            return
        log.warning(
            "%s at %s has not answered for %s (%s); waiting up to %g s from then for it to come back "
            "(outage_wait_s); rollouts in flight wait too",
            self.service,
            self.url,
            span(time.monotonic() - since),
            cause,
            self.window_s,
            extra=_for(self.url),
        )


def is_down_cause(kind: str, status: int | None) -> bool:
    """Whether a failed attempt says the service takes no request now: a refused, reset
    or closed connection, or a 429/502/503/504 from the server or the proxy in front of it."""
    return kind == "connection" or (status is not None and status in DOWN_STATUSES)


def watch_silence(loop: asyncio.AbstractEventLoop, gate: OutageGate, clock: Any, after_s: float, timeouts: str) -> Any:
    """Look at ``clock`` (the requests in flight, oldest first: a
    :class:`~focus.backends.watch.Watch`) every ``after_s / 4`` seconds on ``loop``
    (:meth:`OutageGate.look`): a server that accepts connections and never answers is
    warned about within ``1.25 * after_s``, not silent until every call's deadline.
    Returns an object whose ``cancel()`` stops the watch."""

    class Ticker:
        handle: asyncio.TimerHandle | None = None

        def tick(self) -> None:
            gate.look(time.monotonic(), *gate.waiting_calls(len(clock), clock.oldest()), after_s, timeouts)
            self.handle = loop.call_later(after_s / 4, self.tick)

        def cancel(self) -> None:
            if self.handle is not None:
                self.handle.cancel()

    ticker = Ticker()
    ticker.handle = loop.call_later(after_s / 4, ticker.tick)
    return ticker
