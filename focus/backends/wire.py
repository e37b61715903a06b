"""What the HTTP client uses on one event loop, and how it names a failed attempt.

Split from :mod:`focus.backends.http` (which stays the client's logic): the
:class:`Wire` of one loop (sender, concurrency slots, outage gate, the watches of the
requests in flight), the exceptions that carry a failed attempt through the retry loop,
and the classification of transport errors.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import httpx
import orjson
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError

from focus.backends.hedge import Hedges
from focus.backends.outage import RATE_LIMITED, OutageGate, is_down_cause, span
from focus.backends.send import Sender
from focus.backends.watch import Entry, Watch


class Retryable(Exception):
    """A failed attempt of one of the :data:`~focus.backends.retry.CAUSES`."""

    def __init__(self, kind: str, status: int | None, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.status, self.retry_after = kind, status, retry_after
        #: Hedges sent in this attempt (they failed too).
        self.hedged = 0
        #: A malformed answer that is a sample the server ended itself (:class:`~focus.backends.http.Aborted`).
        self.aborted = False


class Rejected(Exception):
    """The server refused the request itself (a 4xx other than the retried ones).
    ``context_limit``: the refusal says the prompt does not fit the model's context."""

    def __init__(self, message: str, status: int = 400, body: str = "") -> None:
        super().__init__(message)
        self.status, self.body = status, body
        self.context_limit = is_context_limit(status, body)


#: How servers word a prompt over the model's context length (vLLM and the embedded
#: server: "maximum context length"; vLLM's engine, for a prompt that fills the context
#: by itself: "The decoder prompt (length N) is longer than the maximum model length of
#: M"; SGLang: "longer than the model's context length", "exceeds the model's maximum
#: context length", and its scheduler, where the KV cache holds less than the context:
#: "Input length (N tokens) exceeds the maximum allowed length (M tokens)"; OpenAI:
#: "context_length_exceeded"; llama-server: "request (N tokens) exceeds the available
#: context size", type "exceed_context_size_error").
_CONTEXT_LIMIT = re.compile(
    r"context[ _]length|context window|longer than the model|maximum model length|available context size"
    r"|exceed_context_size|maximum allowed length \(\d+ tokens\)",
    re.IGNORECASE,
)


#: The same refusal in the words of vLLM alone, as a gateway or proxy in front of it
#: passes it on with a status of its own (500, 502, 503: LiteLLM and other gateways map
#: an upstream error they do not know to one): "This model's maximum context length is
#: N tokens. However, you requested M tokens ...", its engine's "... longer than the
#: maximum model length of M", or "prompt is too long". Stricter than
#: :data:`_CONTEXT_LIMIT`: a 5xx is a server's failure unless its body says this.
_CONTEXT_LIMIT_5XX = re.compile(
    r"maximum context length is \d+ tokens|longer than the maximum model length of \d+|prompt is too long",
    re.IGNORECASE,
)


def is_context_limit(status: int, body: str) -> bool:
    """Whether a refusal with ``status`` and ``body`` is a prompt over the context: a
    400, 413 or 422 in any server's words, or a 500, 502 or 503 whose body says it in
    vLLM's (:data:`_CONTEXT_LIMIT_5XX`). Such a 5xx was retried as a server error, the
    same refusal every time, and failed its rollout as an outage after ``max_retries``
    where a 400 with those words ends the episode truncated (``ContextLimit``)."""
    if status in (400, 413, 422):
        return _CONTEXT_LIMIT.search(body) is not None
    return status in (500, 502, 503) and _CONTEXT_LIMIT_5XX.search(body) is not None


def quick_retries_left(cfg: Any, wait_outages: bool, last: Retryable, retry: int, probe_s: float) -> bool:
    """Whether a call (under the retry policy ``cfg``) whose attempt ``retry`` failed with
    ``last`` retries on its own soon: only while its waits are shorter than the outage
    gate's probes (``probe_s``; its next backoff, and the ``Retry-After`` asked for): past
    that a call waiting at the gate goes on sooner. A replica (not ``wait_outages``) that
    timed out, or asks for a longer wait, has none: its calls fail over."""
    wait = max(cfg.backoff_cap(retry), last.retry_after or 0.0)
    stuck = not wait_outages and (last.kind == "timeout" or (last.retry_after or 0) >= probe_s)
    return not stuck and retry < cfg.max_retries and wait < probe_s


def down_cause(wait_outages: bool, last: Retryable, gate: OutageGate, now: float) -> bool:
    """Whether a call's failed attempt ``last`` says the service takes no request now
    (:func:`~focus.backends.outage.is_down_cause`; any failure, for a client that does not
    wait for outages). A rate limit's 429 does not while another request sent in the last
    probe interval was answered: the gateway admits a share of the calls, and the
    refused one retries on its own (:func:`next_wait`); waited for at the gate, each such
    call announced an outage and the next answer its end, two lines a call."""
    if not wait_outages:
        return True
    if last.status == RATE_LIMITED and gate.last_ok is not None and now - gate.last_ok < gate.probe_s:
        return False
    return is_down_cause(last.kind, last.status)


def next_wait(
    cfg: Any, rng: random.Random, wait_outages: bool, last: Retryable, retry: int, streak: float, gate: OutageGate
) -> float | str:
    """Seconds to wait before retry ``retry`` (under the retry policy ``cfg``) of a call
    that failed with ``last``, its failures in a row since ``streak``; or why it ends
    (``retries``, ``rate limited``).

    A call a rate limit refuses (429) while other calls are answered (a gateway that
    admits a share of them: no outage, so no wait at the gate) retries past
    ``max_retries``, up to ``outage_wait_s`` from the first of its failures, waiting each
    ``Retry-After`` up to that end, as a call waiting out a rate limit at the gate does:
    it failed after its 10 retries (about 100 s, the Retry-After capped at
    ``backoff_max_s``). One warning line says so (:meth:`OutageGate.throttled`). A client
    that does not wait for outages (a fleet's replica) fails over instead."""
    limited = last.status == RATE_LIMITED and wait_outages
    left = streak + cfg.outage_wait_s - time.monotonic() if limited else 0.0
    if retry >= cfg.max_retries:
        if left <= 0:
            return "rate limited" if limited and cfg.outage_wait_s > 0 else "retries"
        gate.throttled(str(last))
    wait: float = cfg.backoff(retry, rng, last.retry_after)
    return max(wait, min(last.retry_after or 0.0, left)) if limited else wait


class Wire:
    """What a client uses on one event loop: its sender, concurrency slots, outage gate,
    and the watches of its requests' read timeouts (``clock``) and hedged first requests."""

    __slots__ = ("clock", "copy", "gate", "hedges", "keeper", "loop", "sem", "sender", "silence")

    clock: Watch
    hedges: Hedges
    #: The client's ``_hedge``, bound once (a bound method per call is one more object).
    copy: Callable[..., Any]
    #: The silence watch (:func:`focus.backends.outage.watch_silence`; None: off).
    silence: Any

    def __init__(self, loop: asyncio.AbstractEventLoop, sender: Sender, sem: asyncio.Semaphore, gate: OutageGate):
        self.loop, self.sender, self.sem, self.gate = loop, sender, sem, gate
        self.keeper: Any = None

    async def close(self) -> None:
        """Release the watches, the silence watch and the sender; a second call does nothing."""
        self.clock.close()
        self.hedges.close()
        if self.silence is not None:
            self.silence.cancel()
        try:
            await self.sender.aclose()
        except RuntimeError:  # made on a loop that is gone; nothing left to release
            pass

    def close_with_loop(self) -> None:
        """Close this wire when its loop shuts down, if nobody closed it before.

        A synchronous trainer calls ``asyncio.run(collector.collect(...))`` once per
        iteration with one policy, and rarely closes it: each run left its aiohttp
        session open on a closed loop ("Unclosed client session" and its sockets, one per
        iteration). ``asyncio.run`` (and ``asyncio.Runner``) close every async generator
        still open on the loop before closing it (``loop.shutdown_asyncgens``): the wire
        keeps one, started here so that the loop's hook registers it, whose ``finally``
        closes the wire. Dropped while its loop runs (another thread's loop took the
        client), it is closed by the same hook; a loop closed without that shutdown
        leaves the session to the garbage collector, as before."""
        keeper = _closed_at_loop_end(self)
        try:
            keeper.__anext__().send(None)  # type: ignore[attr-defined]  # runs to its yield
        except StopIteration:
            pass
        self.keeper = keeper


async def _closed_at_loop_end(wire: Wire) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await wire.close()


def expire(entry: Entry) -> None:
    """A request's read timeout passed: cancel its task (``_send`` makes it a TimeoutError)."""
    entry.expired = True
    entry.task.cancel()


def classify(e: BaseException) -> Retryable:
    """A transport error -> timeout, connection or (an undecodable body) malformed.
    httpx-aiohttp maps every aiohttp connection error to ``httpx.ConnectTimeout``; the
    aiohttp error it chains says which it was.

    A body whose ``Content-Encoding`` cannot be undone (a corrupt gzip stream, brotli
    without the Brotli package) is an answer, if a bad one: aiohttp raises it as a
    ``ClientPayloadError`` (or ``ClientResponseError``) as it does a connection cut
    mid-body, and it was a "connection" failure, so a server answering every request
    so was waited for as down for ``outage_wait_s`` (300 s) and reported as an outage."""
    if isinstance(e, httpx.DecodingError) or _undecodable(e):
        return Retryable("malformed response", None, f"{type(e).__name__}: {' '.join(str(e).split())}")
    if (head := unparsable_head(e)) is not None:
        return Retryable("malformed response", None, head)
    cause = e.__cause__ if isinstance(e, httpx.TransportError) and e.__cause__ is not None else e
    if isinstance(cause, TimeoutError) or (cause is e and isinstance(e, httpx.TimeoutException)):
        return Retryable("timeout", None, f"{type(cause).__name__}: {cause}")
    return Retryable("connection", None, f"{type(cause).__name__}: {cause}")


def unparsable_head(e: BaseException) -> str | None:
    """What aiohttp's parser found wrong with an answer's status line or headers (None:
    ``e`` is no such error). An answer whose head breaks HTTP/1.1 - ``Transfer-Encoding``
    beside ``Content-Length`` (what some proxies and hand-written servers send), two
    ``Content-Length`` values, a header name with a space, a status line that is not
    HTTP (another protocol on the port) - is an answer, if one the client cannot read:
    it was a "connection" failure, so a server answering every request so was waited for
    as down for ``outage_wait_s`` (300 s) and reported as an outage, its cause last. A
    connection cut inside the head is no such error (aiohttp raises
    ``ServerDisconnectedError``), nor one cut inside the body (``ClientPayloadError``)."""
    if not isinstance(e, aiohttp.ClientResponseError) or not isinstance(e.__cause__, HttpProcessingError):
        return None
    said = " ".join(str(e.__cause__.message).split())
    return f"the answer's HTTP head cannot be parsed ({said[:200]})"


def _undecodable(e: BaseException) -> bool:
    """Whether aiohttp raised ``e`` for a body it could not decode (its encoding)."""
    if not isinstance(e, aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return False
    cause = e.__cause__
    return isinstance(cause, ContentEncodingError) or (
        isinstance(cause, HttpProcessingError) and "content-encoding" in str(cause)
    )


def gave_up(
    method: str, url: Any, attempts: int, elapsed: float, ended: str, last: Retryable, gate: OutageGate, deadline_s: Any
) -> str:
    """The message of a call that gave up (``ended``: see ``HttpClient._give_up``)."""
    status = f"status {last.status}" if last.status is not None else "no status"
    if ended == "deadline":
        within = f" in {elapsed:.1f} s (deadline {deadline_s:g} s)"
    elif ended == "outage" and gate.down_since is not None and last.status == 429:
        within = (
            f"; the {gate.service} has answered every request with status 429 (rate limited) for "
            f"{span(time.monotonic() - gate.down_since)} (waited for it up to outage_wait_s = {gate.window_s:g} s)"
        )
    elif ended == "outage" and gate.down_since is not None:
        within = (
            f"; the {gate.service} has not answered for {span(time.monotonic() - gate.down_since)} "
            f"(waited for it up to outage_wait_s = {gate.window_s:g} s)"
        )
    elif ended == "rate limited":
        within = (
            f"; the {gate.service} answered it with status 429 (rate limited) for {span(elapsed)} "
            f"(retried up to outage_wait_s = {gate.window_s:g} s)"
        )
    elif ended == "down":
        within = f"; the {gate.service} is down (not waited for)"
    else:
        within = ""
    return f"{method} {url} failed after {attempts} attempt(s){within}; last: {status}: {last}"


def redirected(method: str, url: Any, status: int, location: str | None) -> str:
    """Why a redirect (3xx) refuses the request: no client follows one. aiohttp resent a
    POST redirected with 301, 302 or 303 as a GET without its body (RFC 9110 allows it),
    which the server refused (405, 404) or answered as another request, and the line
    named that refusal and no redirect (an ingress sending ``http://`` to ``https://``,
    a path moved); one that keeps the method cost each call a second request. The
    status reads as a refusal of every request (:data:`focus.refusals.REFUSED_STATUSES`)."""
    to = f"to {location!r}" if location else "without saying where (no Location)"
    return (
        f"{method} {url} was rejected with status {status}: it redirects {to}, and redirects are not followed; "
        "set the service's URL (model.url, critic.url) to the address it redirects to"
    )


def encode(body: Any) -> bytes:
    """A request body as compact JSON bytes (``orjson``: about a tenth of ``json.dumps``'s
    CPU for a body of a few hundred prompt ids, which every model call sends; the same
    JSON values, non-ASCII text sent as UTF-8 rather than escaped). Non-string keys are
    written as strings, as ``json.dumps`` does (``logit_bias`` keyed by token id), numpy
    numbers as numbers (a ``temperature`` read off a ``np.linspace`` sweep, which
    ``json.dumps`` wrote, being a ``float``); what ``orjson`` does not write (an ``int``
    past 64 bits, a ``float`` subclass of another library) goes through ``json.dumps``."""
    try:
        return orjson.dumps(body, option=_OPTIONS)
    except TypeError:  # (orjson.JSONEncodeError is one)
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def decode(data: bytes, status: int) -> Any:
    """The JSON value of a 2xx body; :class:`Retryable` ``malformed response`` when it
    is none. A body that is not UTF-8 is read with its undecodable bytes replaced: they
    can only be inside a string (a token's text, cut inside a character by a server
    that does not sanitise it), and FOCUS reads ids and numbers, never those texts; it
    failed the whole answer as "not JSON", the same on every try of a seeded request."""
    try:
        return orjson.loads(data)
    except ValueError:  # not strict JSON (NaN, Infinity, bad UTF-8, huge ints): the lenient reading below
        pass
    try:
        return json.loads(data)
    except UnicodeDecodeError:
        pass
    except ValueError as e:
        raise Retryable("malformed response", status, f"not JSON ({e}): {snippet(text(data))}") from e
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except ValueError as e:
        raise Retryable("malformed response", status, f"not JSON ({e}): {snippet(text(data))}") from e


def headers(extra: dict[str, str], api_key: str | None) -> dict[str, str]:
    """Every request's headers: JSON, ``extra`` (``HttpConfig.headers``), the API key's bearer."""
    out = {"Content-Type": "application/json", **extra}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def text(content: bytes) -> str:
    return content.decode("utf-8", errors="replace")


def snippet(text: str, n: int = 300) -> str:
    text = text.strip().replace("\n", " ")
    return text if len(text) <= n else text[:n] + "..."
