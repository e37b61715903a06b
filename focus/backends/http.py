"""The one HTTP stack of every model and critic client: sending, retries, hedges, stats.

Requests leave through a :class:`~focus.backends.send.Sender`: by default aiohttp's
connection pool and parser called directly (:class:`~focus.backends.send.AiohttpSender`);
any httpx transport - ``httpx.MockTransport``, a proxy, an instrumented
``httpx.AsyncHTTPTransport`` - plugs into the same place (``transport=``), and every
line above the sender is the same for both.

Why this stack (``python -m benchmarks.http_client``, figures in benchmarks/README.md):
a collection keeps 64-256 calls in flight from one process, and the client's CPU per
call is what stands between the engine and the model service. httpx's own transport
(httpcore + h11) costs 4-6 ms of CPU per call at that concurrency, 20-40x aiohttp;
httpx's request and response objects over aiohttp (``httpx-aiohttp``) still cost about
half of aiohttp's own time per call. So the default sends straight through aiohttp,
and what the client adds per call (the retry loop, a hedge timer, the outage gate, a
:class:`~focus.backends.retry.CallRecord`) is kept to a few microseconds: no task per
attempt unless a hedge may be due, no timer per request (read timeouts and hedge looks
each share one timer per client, :mod:`focus.backends.watch`), URLs parsed once per path.

Every call follows one :class:`~focus.backends.retry.RetryPolicy` (see that module):
bounded attempts, full-jitter backoff, ``Retry-After``, a deadline per call, adaptive
hedging, and a wait for a service that stopped answering (:mod:`focus.backends.outage`);
anything else (a 4xx saying the request is wrong) fails at once. After the last try
the caller gets one error (``PolicyError`` for policies, ``CriticError`` for critics)
naming the URL, the last status and the cause. What each call cost is a
:class:`~focus.backends.retry.CallRecord`; :meth:`HttpClient.stats` totals them.

The sender, the semaphore, the outage gate and the watches belong to one event loop. Policies are
pickled to Dask workers and used from several ``asyncio.run`` calls, so all three are
created lazily for the running loop and dropped when pickling.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import aiohttp
import httpx

from focus.backends import hedge as hedging
from focus.backends.foreign import refused_token_ids, url_problem
from focus.backends.outage import OVER, UP, OutageGate, OutageTotals, watch_silence
from focus.backends.retry import (
    CallRecord,
    ClientStats,
    HedgeTimer,
    HttpConfig,
    RetryPolicy,
    http_config,
    is_retry_status,
    parse_retry_after,
)
from focus.backends.send import AiohttpSender, HttpxSender, Sender
from focus.backends.unreadable import Unreadable, probe, unreadable_line
from focus.backends.watch import Entry, Watch
from focus.backends.wire import Rejected as _Rejected
from focus.backends.wire import Retryable as _Retryable
from focus.backends.wire import Wire as _Wire
from focus.backends.wire import classify as _classify
from focus.backends.wire import decode as _decode
from focus.backends.wire import down_cause as _down_cause
from focus.backends.wire import encode as _encode
from focus.backends.wire import expire as _expire
from focus.backends.wire import gave_up as _gave_up
from focus.backends.wire import headers as _headers
from focus.backends.wire import is_context_limit
from focus.backends.wire import next_wait as _next_wait
from focus.backends.wire import quick_retries_left as _quick_retries_left
from focus.backends.wire import redirected as _redirected
from focus.backends.wire import snippet as _snippet
from focus.backends.wire import text as _text
from focus.local_limits import local_error
from focus.policy import (
    BadResponse,
    ContextLimit,
    PolicyError,
    ServiceUnavailable,
    UnreadableAnswers,
)

__all__ = ["Aborted", "HttpClient", "HttpConfig", "MalformedResponse", "RetryPolicy", "Unservable"]

T = TypeVar("T")


class MalformedResponse(ValueError):
    """The server answered 2xx but the body is not what the API promises; retried."""


class Aborted(MalformedResponse):
    """The server ended the sample itself (``finish_reason`` ``abort`` or ``error``):
    retried as a malformed answer, but never counted as an answer of a shape the client
    cannot read (:mod:`focus.backends.unreadable`). An SGLang weights update with
    ``abort_all_requests`` (or vLLM's pause with abort) ends every request in flight so
    at once, each of which is answered on its retry; counted, 16 of them in a row stopped
    the collection as unreadable."""


class Unservable(MalformedResponse):
    """An answer whose shape shows the server gives no sampled ids and log-probs on any
    request (llama-server's ``/v1/completions``, log-prob tokens named by their text,
    chat-format log-probs): the first stops the collection (``unreadable``) with the
    message, naming what is missing and the setting that gives it. It waited for
    :data:`~focus.backends.unreadable.Unreadable.FIRST` such answers (16 mid-run)."""


class HttpClient:
    """JSON over HTTP under one retry policy; one per backend instance, safe to pickle.

    ``error`` is the exception class a call that gives up raises (``PolicyError`` for
    policies, ``CriticError`` for critics); it is also the class a ``parse`` function
    may raise for an answer it cannot trust, which is retried like a malformed body.
    A call whose retries ran out raises ``unavailable`` instead (by default
    :class:`~focus.policy.ServiceUnavailable` for policies, so the collector can tell an
    outage from a wrong request; ``error`` otherwise), or, when the last answer could
    not be used, :class:`~focus.policy.BadResponse` (policies; ``error`` otherwise).
    A service that stops answering is waited for first (``outage_wait_s``,
    :mod:`focus.backends.outage`).
    """

    def __init__(
        self,
        base_url: str,
        config: HttpConfig | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        error: type[Exception] = PolicyError,
        unavailable: type[Exception] | None = None,
        service: str | None = None,
        wait_outages: bool = True,
        probe: Callable[[Any, int], Any] | None = None,
    ) -> None:
        if why := url_problem(base_url, "base_url"):
            raise ValueError(why)
        self.base_url = base_url.rstrip("/")
        self.config = http_config(config)
        self.error = error
        self.unavailable = unavailable or (ServiceUnavailable if error is PolicyError else error)
        #: Raised when the last attempt's answer could not be used (malformed, or a
        #: ``parse`` that raised ``error``): the service answers, so it is no outage.
        self.bad = BadResponse if error is PolicyError else error
        #: Raised when the answers repeat one malformed shape (:mod:`focus.backends.unreadable`).
        self.unreadable = UnreadableAnswers if error is PolicyError else error
        #: What the outage log lines call the service.
        self.service = service or ("model service" if error is PolicyError else "service")
        #: False: a service that is down (past the quick retries) fails the call at once
        #: instead of being waited for - a replica whose calls others can take. Any failure
        #: but a malformed answer counts as down then (a 429 or 500 to every call was
        #: retried on the replica for 11 attempts, about 20 s, while others could answer),
        #: and an attempt unanswered for ``timeout_s`` fails the call at once (a wedged or
        #: stopped replica, where retrying it held the call up to ``deadline_s``), as does
        #: a ``Retry-After`` longer than the quick retries (each retry waited it, up to
        #: ``backoff_max_s``).
        self.wait_outages = wait_outages
        #: The k-th request body (from 1) beside a given one (decoded), to another prompt: the
        #: probe telling another server's answer format from one request's bad answer.
        self.probe = probe
        self._transport = transport
        self._rng = random.Random()
        self._wire: _Wire | None = None
        self._headers = _headers(self.config.headers, self.config.api_key)
        self._urls: dict[str, tuple[Any, dict[int | None, tuple[str, int]]]] = {}
        self._stats = ClientStats()
        self._outages = OutageTotals()
        self._hedger = HedgeTimer(self.config)
        self._unread = Unreadable()

    def _rejected(self, e: _Rejected) -> Exception:
        """A policy's prompt over the context: :class:`ContextLimit` (the agent truncates);
        a server that refuses a prompt of token ids: :class:`UnreadableAnswers` (a setting
        to change, :func:`~focus.backends.foreign.refused_token_ids`)."""
        if self.error is PolicyError:
            if e.context_limit:
                return ContextLimit(str(e))
            if line := refused_token_ids(self.base_url, e.status, e.body):
                return UnreadableAnswers(line)
        return self.error(str(e))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_wire=None, _transport=None, _urls={}, _stats=ClientStats(), _outages=OutageTotals(), _rng=None)
        state["_unread"] = Unreadable()
        state["_hedger"] = HedgeTimer(self.config)  # latencies are this process's
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._rng = random.Random()  # each copy its own jitter: copies must not retry in lockstep

    # ---- statistics ----

    def stats(self) -> dict[str, Any]:
        """Totals of this client's calls in this process (fields: :class:`ClientStats`),
        with ``outages`` and ``outage_s``: outages of the service waited out and their
        seconds (:class:`~focus.backends.outage.OutageGate`)."""
        return {**self._stats.as_dict(), **self._outages.as_dict()}

    def hedge_delays(self) -> dict[str, float]:
        """The adaptive hedge delays this client has learnt, by endpoint and size class."""
        return self._hedger.delays()

    @property
    def retries(self) -> dict[str, int]:
        """Failed attempts that were retried, by cause (``stats()["retries"]``)."""
        return dict(self._stats.retries)

    # ---- sending ----

    def _wire_for_loop(self) -> _Wire:
        """The sender, semaphore, outage gate and watches of the running loop, made on first use there."""
        loop = asyncio.get_running_loop()
        wire = self._wire
        if wire is None or wire.loop is not loop:
            cfg = self.config
            sender: Sender = (
                AiohttpSender(cfg.max_concurrency, cfg.connect_timeout_s)
                if self._transport is None
                else HttpxSender(self._transport, cfg.connect_timeout_s)
            )
            gate = OutageGate(
                cfg.outage_wait_s,
                service=self.service,
                url=self.base_url,
                probe_s=cfg.backoff_max_s,
                totals=self._outages,
            )
            wire = self._wire = _Wire(loop, sender, asyncio.Semaphore(cfg.max_concurrency), gate)
            wire.clock = Watch(loop, lambda: cfg.timeout_s, _expire)
            wire.hedges = hedging.Hedges(loop, self._hedger)
            wire.copy = self._hedge
            ends = f"each attempt times out after timeout_s = {cfg.timeout_s:g} s, each call after deadline_s = {cfg.deadline_s}"
            after = cfg.silence_warn_s
            wire.silence = None if after is None else watch_silence(loop, gate, wire.clock, after, ends)
            wire.close_with_loop()
        return wire

    def request(
        self,
        method: str,
        path: str,
        body: Any | None,
        parse: Callable[[Any], T],
        *,
        hedge: bool = True,
        size: int | None = None,
    ) -> Coroutine[Any, Any, T]:
        """Send, decode JSON, ``parse`` it; retry transient failures; raise ``self.error``.
        (Await it; the body is encoded when it is called, see :meth:`call`.)"""
        content = None if body is None else _encode(body)
        return self._request(method, path, content, parse, hedge, size)

    async def _request(
        self, method: str, path: str, content: bytes | None, parse: Callable[[Any], T], hedge: bool, size: int | None
    ) -> T:
        value, _ = await self._call(method, path, content, parse, hedge, size)
        return value

    def call(
        self,
        method: str,
        path: str,
        body: Any | None,
        parse: Callable[[Any], T],
        *,
        hedge: bool = True,
        size: int | None = None,
    ) -> Coroutine[Any, Any, tuple[T, CallRecord]]:
        """:meth:`request`, also returning what the call cost. ``hedge=False`` for a
        request whose answer may differ between two identical sends (an unseeded sample).
        ``size``: what the answer's time grows with (``max_tokens``, contexts scored), so
        that the adaptive hedge compares it with requests of its size (:class:`HedgeTimer`).

        Await it. ``body`` is encoded when it is called, and not kept while the call is
        in flight: a body holds a list of every prompt id, and each of the 64-256 calls
        in flight would otherwise be one more large young container for every garbage
        collection to walk (pass it straight in, as :meth:`~focus.backends.http_policy.HttpPolicy.sample` does, not
        from a local); and a plain function returning the call's coroutine is one
        coroutine fewer per call than an ``async def`` awaiting it."""
        content = None if body is None else _encode(body)
        return self._call(method, path, content, parse, hedge, size)

    async def _call(
        self, method: str, path: str, content: bytes | None, parse: Callable[[Any], T], hedge: bool, size: int | None
    ) -> tuple[T, CallRecord]:
        cfg = self.config
        wire = self._wire_for_loop()
        route = self._urls.get(path)
        if route is None:  # parsed once per path (a URL parser costs ~20 us a call)
            route = self._urls[path] = (wire.sender.url(f"{self.base_url}{path}"), {})
        url, keys = route
        key = keys.get(size)
        if key is None:  # one latency-class key per path and size, not a tuple per call
            key = keys[size] = HedgeTimer.key(path, size)
        timer = self._hedger
        hedge = hedge and timer.enabled
        t0 = time.monotonic()
        deadline = None if cfg.deadline_s is None else t0 + cfg.deadline_s
        try:  # the first attempt: _attempt's steps, inline (one coroutine fewer per call)
            async with wire.sem:
                timer.earn()
                if not hedge:
                    value, took = await self._send(wire, method, url, content, parse, deadline)
                    sent, won = 0, None
                else:
                    args = (wire, method, url, content, parse, deadline)
                    entry = hedging.enter(wire.hedges, wire.copy, args, key, _Retryable)
                    try:
                        value, took = await self._send(*args, entry)
                    except BaseException as e:
                        (value, took), sent, won = await hedging.failed(entry, e)
                    else:
                        sent, won = hedging.answered(entry), None
                if timer.observe(key, took):
                    wire.hedges.retime(key)
        except _Retryable as e:
            return await self._retry(wire, method, url, content, parse, key, hedge, t0, deadline, e)
        except _Rejected as e:
            self._stats.add(CallRecord(1, time.monotonic() - t0, (("rejected", time.monotonic() - t0),), "rejected"))
            raise self._rejected(e) from None
        now = time.monotonic()
        wire.gate.answered(t0, now)
        if (unread := self._unread).answers or unread.never_answered:
            unread.answered()
        # positional: keyword arguments cost a frozen dataclass a microsecond more, every call
        record = CallRecord(1, now - t0, (), None, False, sent, won is not None, won or 0.0)
        self._stats.add(record)
        return value, record

    async def _retry(
        self,
        wire: _Wire,
        method: str,
        url: Any,
        content: bytes | None,
        parse: Callable[[Any], T],
        key: tuple[str, int],
        hedge: bool,
        t0: float,
        deadline: float | None,
        last: _Retryable,
    ) -> tuple[T, CallRecord]:
        """The rest of a call whose first attempt (started at ``t0``) failed with ``last``:
        backoff and retries, or waiting at the outage gate, until an answer or the end."""
        cfg, gate = self.config, wire.gate
        errors: list[tuple[str, float]] = []
        hedges, attempts, retry, started = last.hedged, 1, 0, t0
        streak: float | None = None  # when the current run of failed attempts began
        while True:
            now = time.monotonic()
            streak = now if streak is None else streak
            answered = last.kind == "malformed response"  # an answer, if a bad one: not an outage
            if answered and await self._unreadable(wire, method, url, content, parse, deadline, last):
                self._stats.add(CallRecord(attempts, now - t0, (*errors, (last.kind, now - started)), last.kind))
                raise self.unreadable(unreadable_line(self.service, method, url, self._unread)) from None
            if not answered:
                gate.failed(now, last.retry_after, last.status)
            if not answered and gate.should_wait(
                streak_start=streak,
                retries_left=_quick_retries_left(cfg, self.wait_outages, last, retry, gate.probe_s),
                down_cause=_down_cause(self.wait_outages, last, gate, now),
            ):
                if not self.wait_outages:
                    ended = "down"
                    break
                if deadline is not None and now + (last.retry_after or 0.0) >= deadline:
                    ended = "deadline"  # the service asks for a wait past the call's deadline: no retry
                    break
                turn = await gate.wait(deadline, str(last))
                if turn == OVER:
                    ended = "deadline" if deadline is not None and time.monotonic() >= deadline else "outage"
                    break
                if turn == UP:  # the service is back: this call's retries start afresh
                    retry, streak = 0, None
            else:
                wait = _next_wait(cfg, self._rng, self.wait_outages, last, retry, streak, gate)
                if isinstance(wait, str):
                    ended = "deadline" if deadline is not None and time.monotonic() >= deadline else wait
                    break
                if deadline is not None and time.monotonic() + wait >= deadline:
                    ended = "deadline"
                    break
                with gate.backing_off(t0, str(last), last.status):  # waiting, with no request in flight
                    await asyncio.sleep(wait)
                retry += 1
            errors.append((last.kind, time.monotonic() - started))
            started = time.monotonic()
            attempts += 1
            try:
                value, sent, won = await self._attempt(wire, method, url, content, parse, key, hedge, deadline)
            except _Retryable as e:
                last = e
                hedges += e.hedged
                continue
            except _Rejected as e:
                errors.append(("rejected", time.monotonic() - started))
                self._stats.add(CallRecord(attempts, time.monotonic() - t0, tuple(errors), "rejected", hedges=hedges))
                raise self._rejected(e) from None
            now = time.monotonic()
            gate.answered(started, now)
            self._unread.answered()
            record = CallRecord(
                attempts, now - t0, tuple(errors), hedges=hedges + sent, hedge_won=won is not None, hedge_s=won or 0.0
            )
            self._stats.add(record)
            return value, record
        errors.append((last.kind, time.monotonic() - started))
        raise self._give_up(method, url, attempts, t0, ended, tuple(errors), hedges, last, gate)

    def _give_up(
        self,
        method: str,
        url: Any,
        attempts: int,
        t0: float,
        ended: str,
        errors: tuple[tuple[str, float], ...],
        hedges: int,
        last: _Retryable,
        gate: OutageGate,
    ) -> Exception:
        """Record a call that gave up (``ended`` by its ``retries``, its ``deadline``, the
        ``outage`` window, a ``rate limited`` one's, or a service ``down`` that is not
        waited for); the error to
        raise (``unavailable``, or ``bad`` for an answer that could not be used)."""
        elapsed = time.monotonic() - t0
        self._stats.add(CallRecord(attempts, elapsed, errors, last.kind, ended == "deadline", hedges))
        error = self.bad if last.kind == "malformed response" else self.unavailable
        return error(_gave_up(method, url, attempts, elapsed, ended, last, gate, self.config.deadline_s))

    async def _unreadable(
        self,
        wire: _Wire,
        method: str,
        url: Any,
        content: bytes | None,
        parse: Any,
        deadline: float | None,
        last: _Retryable,
    ) -> bool:
        """After a malformed answer (``last``) to ``content``, whether the answers cannot
        be read; with a probe, in a slot of its own, where the count wants one
        (:mod:`focus.backends.unreadable`). A sample the server ended itself
        (:class:`Aborted`) is not counted."""
        if last.aborted:
            return False
        if self._unread.malformed(str(last), content):
            return True
        if self.probe is None or content is None or not (n := self._unread.take_probe(content)):
            return False
        return await probe(
            self._unread, self.probe, content, lambda b: self._hedge(wire, method, url, b, parse, deadline), n
        )

    async def _attempt(
        self,
        wire: _Wire,
        method: str,
        url: Any,
        content: bytes | None,
        parse: Callable[[Any], T],
        key: tuple[str, int],
        hedge: bool,
        deadline: float | None,
    ) -> tuple[T, int, float | None]:
        """One attempt: the value, the hedges sent, and - when a hedge answered - how
        long the request it overtook had waited (None when the first request answered).
        (A call's first attempt runs these same steps inline in :meth:`_call`.)

        The first request holds one of the client's ``max_concurrency`` slots for the
        whole attempt; each hedge waits for a slot of its own. With ``hedge``, copies
        race the first request (the steps of :func:`focus.backends.hedge.race`: sent when the newest
        request has gone :meth:`HedgeTimer.delay` without an answer, within the hedge
        budget; the first good answer wins). A request the server rejects (4xx) ends
        the attempt at once: its copies would be rejected the same way. Every good
        answer's own time (from its send) feeds the timer's latency window.
        """
        timer = self._hedger
        async with wire.sem:
            timer.earn()
            if not hedge:
                value, took = await self._send(wire, method, url, content, parse, deadline)
                if timer.observe(key, took):
                    wire.hedges.retime(key)
                return value, 0, None
            # the steps of focus.backends.hedge.race, inline: one coroutine fewer per call
            args = (wire, method, url, content, parse, deadline)
            entry = hedging.enter(wire.hedges, wire.copy, args, key, _Retryable)
            try:
                value, took = await self._send(*args, entry)
            except BaseException as e:
                (value, took), copies, won = await hedging.failed(entry, e)
            else:
                copies, won = hedging.answered(entry), None
            if timer.observe(key, took):
                wire.hedges.retime(key)
            return value, copies, won

    async def _hedge(
        self,
        wire: _Wire,
        method: str,
        url: Any,
        content: bytes | None,
        parse: Callable[[Any], T],
        deadline: float | None,
    ) -> tuple[T, float]:
        """A copy of an attempt's request, in a concurrency slot of its own."""
        async with wire.sem:
            return await self._send(wire, method, url, content, parse, deadline)

    async def _send(
        self,
        wire: _Wire,
        method: str,
        url: Any,
        content: bytes | None,
        parse: Callable[[Any], T],
        deadline: float | None,
        entry: Entry | None = None,
    ) -> tuple[T, float]:
        """One request: send, read, check the status, decode and parse; raise _Retryable.
        Returns the parsed value and the seconds from the send to the parsed answer.
        ``entry``: the request's hedge entry (a first request), its clock entry too.

        The read timeout is the wire's ``clock`` (one timer for every request whose
        limit is ``timeout_s``), with ``asyncio.timeout``'s rules: a cancellation of its
        own becomes ``TimeoutError``, one from outside stays a cancellation. A request
        that the call's deadline leaves less time gets an ``asyncio.timeout`` of its own."""
        sent = time.monotonic() if entry is None else entry.start
        limit = self.config.timeout_s
        try:
            if deadline is not None and deadline - sent < limit:
                limit = max(deadline - sent, 0.0)
                async with asyncio.timeout(limit):
                    status, data, retry_after = await wire.sender.send(method, url, content, self._headers)
            else:
                if entry is None:
                    task = asyncio.current_task()
                    assert task is not None
                    entry = Entry(sent, task, task.cancelling())
                task = entry.task
                wire.clock.add(entry)
                try:
                    status, data, retry_after = await wire.sender.send(method, url, content, self._headers)
                except BaseException as e:
                    wire.clock.discard(entry)
                    if entry.expired and task.uncancel() <= entry.cancelling and isinstance(e, asyncio.CancelledError):
                        raise TimeoutError from e
                    raise
                wire.clock.discard(entry)
                if entry.expired:
                    task.uncancel()
        except TimeoutError as e:
            what = "the call's deadline passed" if limit < self.config.timeout_s else f"no answer within {limit:g} s"
            raise _Retryable("timeout", None, what) from e
        except (httpx.RequestError, aiohttp.ClientError, OSError) as e:
            if (local := local_error(e, f" connecting to the {self.service} at {self.base_url}")) is not None:
                raise local from e  # this machine's limit: no retry, no outage (focus.local_limits)
            raise _classify(e) from e
        if status >= 400:
            text = _text(data)
            if is_retry_status(status) and not (status >= 500 and is_context_limit(status, text)):
                raise _Retryable("server error", status, _snippet(text), parse_retry_after(retry_after))
            raise _Rejected(f"{method} {url} was rejected with status {status}: {_snippet(text)}", status, text)
        if status >= 300:  # ``retry_after`` is the redirect's Location (Sender)
            raise _Rejected(_redirected(method, url, status, retry_after), status, _text(data))
        decoded = _decode(data, status)
        try:
            value = parse(decoded)
        except Unservable as e:  # the first such answer: every other would be the same
            raise self.unreadable(f"the {self.service} at {self.base_url} cannot be recorded token-exactly: {e}") from e
        except (MalformedResponse, self.error, KeyError, TypeError, IndexError, ValueError, AttributeError) as e:
            bad = _Retryable("malformed response", status, f"{type(e).__name__}: {e}")
            bad.aborted = isinstance(e, Aborted)
            raise bad from e
        return value, time.monotonic() - sent

    async def peek(self, path: str, parse: Callable[[Any], T]) -> T | None:
        """One ``GET`` of ``path``, ``parse``d: what a client asks of the server's settings
        beside its calls. Never retried, hedged, waited for or counted in :meth:`stats`;
        None on any failure, within ``timeout_s``. Under the calls' semaphore, which
        bounds every request: a question after an answer made 3 in flight under 2."""
        wire = self._wire_for_loop()
        try:
            async with wire.sem, asyncio.timeout(self.config.timeout_s):  # the wait for a slot is not timed
                status, data, _ = await wire.sender.send(
                    "GET", wire.sender.url(f"{self.base_url}{path}"), None, self._headers
                )
            return parse(_decode(data, status)) if status == 200 else None
        except (TimeoutError, OSError, httpx.HTTPError, aiohttp.ClientError, _Retryable, ValueError):
            return None

    async def aclose(self) -> None:
        wire, self._wire = self._wire, None
        if wire is not None:
            await wire.close()
