"""The one retry policy of every HTTP client of a model or critic service, and its decisions.

A collection makes thousands of calls; a few meet an overloaded server (429/503), a
restart (a closed connection), an answer that never comes or a garbled body. Every
client (:class:`~focus.backends.OpenAICompatPolicy`, :class:`~focus.backends.SGLangPolicy`,
:class:`~focus.critic.HttpCritic`) sends through :class:`focus.backends.http.HttpClient`,
which follows the :class:`RetryPolicy` here:

* each attempt waits at most ``timeout_s`` for its answer;
* a transient failure (:data:`CAUSES`) is retried up to ``max_retries`` times after a
  *full-jitter* exponential backoff - a wait drawn uniformly from
  ``[0, min(backoff_max_s, backoff_s * 2**n)]`` - so that clients that failed together
  do not come back together; a ``Retry-After`` header is a floor on that wait;
* a service that answers nobody for longer than the retries (refused or reset
  connections, 502/503/504: a restart; 429: a rate limit) is waited for, up to ``outage_wait_s`` from
  its first failure, by every call at once (:mod:`focus.backends.outage`);
* the whole call, attempts and waits together, ends by ``deadline_s``: a retry that
  could not finish in time is not started;
* a *hedge* (on by default): when an attempt has not answered after twice the recent
  p99 latency of its kind (:class:`HedgeTimer`; or after a fixed ``hedge_after_s``), an
  identical copy is sent and the first good answer wins, so a hang or a stalled replica
  costs about that delay instead of a whole timeout. The client hedges only requests
  whose answer does not depend on which copy answers (a seeded sample, a critic score):
  taking the faster of two unseeded samples would favour short ones.

This module holds the policy and its decisions (backoff, ``Retry-After``, when to
hedge) and the per-call :class:`CallRecord` with its tally :class:`ClientStats`; it
imports nothing but pydantic, so configuration code can use it without loading an HTTP
stack.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import random
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: Why an attempt failed and was (or could have been) retried. ``server error``: status
#: 408, 409, 425, 429 or any 5xx but 501 and 505; ``timeout``: no answer within the attempt's time;
#: ``connection``: refused, reset or closed before the answer; ``malformed response``:
#: a 2xx whose body is not JSON or not what the API promises (ids and log-probs that
#: do not line up, non-finite log-probs, a critic answer of the wrong length).
CAUSES = ("server error", "timeout", "connection", "malformed response")

#: Default of :attr:`RetryPolicy.first_contact_s`.
FIRST_CONTACT_S = 5.0

RETRY_STATUSES = frozenset({408, 409, 425, 429})
#: 5xx statuses that say the server cannot do this at all (501 Not Implemented: a web
#: server that is no model service answers it to every POST; 505 HTTP Version Not
#: Supported): retrying them only waits out an outage that is not one.
NEVER_RETRY_5XX = frozenset({501, 505})


def is_retry_status(status: int) -> bool:
    """Statuses that say "try again later" rather than "this request is wrong"."""
    return status in RETRY_STATUSES or (status >= 500 and status not in NEVER_RETRY_5XX)


class RetryPolicy(BaseModel):
    """How long to wait and how often to try again: one policy for every HTTP client.

    Set from a config file as ``model.http`` / ``critic.http`` (see docs/model-services.md,
    "Timeouts, retries and hedging").
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Seconds one attempt waits for its answer; a long generation needs a long timeout.
    timeout_s: float = Field(120.0, gt=0)
    #: Seconds to open a connection (part of an attempt's ``timeout_s`` too).
    connect_timeout_s: float = Field(5.0, gt=0)
    #: Retries after the first attempt (so ``max_retries + 1`` attempts at most).
    max_retries: int = Field(10, ge=0)
    #: Backoff cap before retry ``n`` (0-based) is ``min(backoff_max_s, backoff_s * 2**n)``.
    #: A short first wait (an isolated failure is retried at once, 10 ms on average, well
    #: under one generation) and many doublings (10 retries span up to 20 s, about 10 s
    #: with jitter: a server restart) - see docs/model-services.md.
    backoff_s: float = Field(0.02, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)
    #: Full jitter: wait a uniform draw from ``[0, cap]``; False waits exactly ``cap``.
    jitter: bool = True
    #: Seconds one call may take, every attempt and wait included; None: no limit
    #: beyond the attempts. A retry that cannot finish by then is not started.
    deadline_s: float | None = Field(600.0, gt=0)
    #: Seconds to wait for a service that has answered this client before and stopped
    #: answering (connections refused or reset, 502/503/504: a restart, a weights
    #: reload, a node drain; 429 to every request: a gateway's rate limit, whose
    #: ``Retry-After`` is honoured up to the window's end), counted from its first failure: the calls in flight wait
    #: instead of failing and go on when it answers again (focus/backends/outage.py).
    #: The default covers a vLLM or SGLang restart with a large model (weights loaded
    #: from disk, graphs captured); 0: fail within the ordinary retries. A call's
    #: ``deadline_s`` still ends it.
    outage_wait_s: float = Field(300.0, ge=0)
    #: Seconds the ``focus`` command (and a flow run, once it has work to do) tries to
    #: connect to the service before anything starts (:mod:`focus.backends.reach`): a URL
    #: that takes no connection in that time (a wrong port or host, a server not
    #: started) is one line, not an outage waited out. A server that opens its port only
    #: once it has loaded its weights (SGLang, minutes for a large model) is there after
    #: a longer one; a script that starts the server itself may want a shorter one.
    first_contact_s: float = Field(FIRST_CONTACT_S, gt=0)
    #: Seconds without any answer from the service, while requests wait, after which
    #: one warning line says so (with the URL and how many wait), looked at every
    #: quarter of it: a server that accepts connections and never answers was silent
    #: until ``deadline_s``. Shorter than ``timeout_s`` so it comes before the first
    #: timeout; a generation that takes longer than this with nothing else answering
    #: (a long first turn of a large model) warns once too. None: no warning.
    silence_warn_s: float | None = Field(60.0, gt=0)
    #: Send a second identical request when an attempt has not answered after this
    #: many seconds (if shorter than ``timeout_s``), and take the first good answer;
    #: None: the adaptive delay below, or never when ``adaptive_hedge`` is off.
    hedge_after_s: float | None = Field(None, gt=0)
    #: With ``hedge_after_s`` unset, hedge an attempt once it has waited longer than
    #: this client's recent answers on the same endpoint and size class say it should
    #: (:class:`HedgeTimer`); False: never hedge unless ``hedge_after_s`` is set.
    adaptive_hedge: bool = True

    def backoff_cap(self, retry: int) -> float:
        """The longest wait before retry number ``retry`` (0-based), jitter aside."""
        return min(self.backoff_max_s, self.backoff_s * 2.0**retry)

    def backoff(self, retry: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based).

        A server's ``Retry-After`` raises the wait to at least what it asked, up to
        ``backoff_max_s`` (a server asking for an hour must not stall a collection;
        the deadline ends the call instead)."""
        cap = self.backoff_cap(retry)
        wait = rng.uniform(0.0, cap) if self.jitter else cap
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.backoff_max_s))
        return wait


class HttpConfig(RetryPolicy):
    """A client's retry policy plus its connection settings."""

    #: Requests in flight at once from this client (per event loop); hedges count too.
    max_concurrency: int = Field(64, gt=0)
    #: Send the first calls of sibling rollouts (one start state, consecutive seeds, in
    #: the same turn of the event loop) as one request with ``n`` samples, where the
    #: server's dialect has it (OpenAI-compatible: vLLM samples ``i`` with ``seed + i``;
    #: checked once against a single request, see ``focus.siblings``). False: one
    #: request per call. The answers are the same either way.
    group_siblings: bool = True
    headers: dict[str, str] = Field(default_factory=dict)
    #: Sent as ``Authorization: Bearer``; kept out of the config's repr (a log line, a traceback).
    api_key: str | None = Field(None, repr=False)


def http_config(config: HttpConfig | None, who: str = "config") -> HttpConfig:
    """``config``, or the defaults for None; anything else is one TypeError naming ``who``
    (a dict of options failed later, on an attribute it lacks: 'headers')."""
    if config is None:
        return HttpConfig()
    if not isinstance(config, HttpConfig):
        raise TypeError(
            f"{who} must be a focus.backends.HttpConfig (HttpConfig(**options)), got a {type(config).__name__}"
        )
    return config


class HedgeTimer:
    """When an attempt gets a hedge: the delay per endpoint and size class, and a budget.

    The adaptive delay follows *The Tail at Scale* (Dean and Barroso, 2013): send a copy
    of a request once it is slower than almost every recent answer, so that a request
    stuck behind a hang, a dead connection or a stalled replica costs about that delay
    rather than a whole timeout. Here the delay is ``max(MIN_S, FACTOR * q)``, with ``q``
    the ``QUANTILE`` of the last ``WINDOW`` successful latencies of this client on the
    same path and the same *size class* (the request's size hint - ``max_tokens`` for a
    generation, contexts for a critic - rounded to a power of two, so a long generation
    is compared with generations of its length, not with short ones). Why these numbers
    (docs/model-services.md, "Hedging"): a healthy server answers past ``2 * q99`` about once
    in 10^4 calls for an exponential tail, about once in 400 for a Pareto tail of index 2
    - so hedges on a healthy server, slow or not, are rare and cost at most that share
    of extra requests; a server that is slow throughout has slow answers in its window
    and a delay to match. A class with fewer than ``MIN_SAMPLES`` answers has no
    adaptive delay yet (no hedge).

    Hedges are limited twice: an attempt has at most ``COPIES`` requests in flight (a
    hedge may land on a hang too, or fail at once while the first still hangs), and
    hedges spend a token bucket that every first request fills by ``BUDGET`` up to
    ``BURST``, so over any stretch of time hedges are at most ``BUDGET`` of the requests
    plus ``BURST`` - a server that slows down for everyone is not sent twice the load.
    The one exception is a request ``OVERDUE`` times past its delay, which is hedged
    anyway (a straggler the collection waits for sends no new requests to refill the
    bucket). The fixed ``hedge_after_s`` replaces the
    adaptive delay and keeps both limits.
    """

    QUANTILE = 0.99
    FACTOR = 2.0
    MIN_S = 0.1
    WINDOW = 500
    MIN_SAMPLES = 50
    #: New answers in a class before its quantile is computed again (sorting a window
    #: per call would cost more than the call's own client CPU).
    REFRESH = 25
    COPIES = 3
    BUDGET = 0.1
    BURST = 10.0
    #: A request that has waited this many times its delay gets its hedge even with the
    #: budget spent: the budget refills only as new requests are sent, and a straggler
    #: that holds a wave back is exactly when none are (found at 20k transitions with 10%
    #: faults: a hang waited out its whole 120 s timeout with the bucket at 0.8).
    OVERDUE = 10.0
    #: Seconds between looks at a class that has no delay yet, while a request waits.
    RECHECK_S = 0.1

    def __init__(self, policy: RetryPolicy) -> None:
        self.fixed = policy.hedge_after_s
        self.adaptive = policy.adaptive_hedge and self.fixed is None
        self.timeout_s = policy.timeout_s
        self._windows: dict[tuple[str, int], deque[float]] = {}
        self._delays: dict[tuple[str, int], float] = {}
        self._fresh: Counter[tuple[str, int]] = Counter()
        self._tokens = self.BURST

    @property
    def enabled(self) -> bool:
        """Whether any request may be hedged (a fixed delay shorter than the timeout, or adaptive)."""
        return self.adaptive or (self.fixed is not None and self.fixed < self.timeout_s)

    @staticmethod
    def key(path: str, size: int | None) -> tuple[str, int]:
        """The latency class of a request: its path and its size rounded up to a power of two."""
        return path, 0 if size is None else max(0, int(size)).bit_length()

    def observe(self, key: tuple[str, int], seconds: float) -> bool:
        """A successful answer on ``key`` that took ``seconds`` from its send; True when
        the class's delay changed."""
        if not self.adaptive:
            return False
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = deque(maxlen=self.WINDOW)
        window.append(seconds)
        self._fresh[key] += 1
        if len(window) >= self.MIN_SAMPLES and (key not in self._delays or self._fresh[key] >= self.REFRESH):
            delay = max(self.MIN_S, self.FACTOR * quantile(window, self.QUANTILE))
            changed = delay != self._delays.get(key)
            self._delays[key] = delay
            self._fresh[key] = 0
            return changed
        return False

    def delay(self, key: tuple[str, int]) -> float | None:
        """Seconds an attempt on ``key`` waits for an answer before a hedge; None: no
        hedge now (off, not learnt yet, or no shorter than the attempt's timeout)."""
        d = self.fixed if self.fixed is not None else self._delays.get(key) if self.adaptive else None
        return d if d is not None and d < self.timeout_s else None

    def first_look_s(self, key: tuple[str, int]) -> float:
        """Seconds after its send that an attempt on ``key`` first needs its hedge race
        to look at it: the class's delay, or ``RECHECK_S`` while it has none (then the
        race looks again every ``RECHECK_S`` for a delay learnt meanwhile). The same for
        every request of the class at any one time (:class:`focus.backends.watch.Watch`)."""
        d = self.delay(key)
        return self.RECHECK_S if d is None else d

    def delays(self) -> dict[str, float]:
        """The adaptive delays learnt so far, by class (``"<path> <sizes>"``), for reports."""
        out = {}
        for (path, bits), d in sorted(self._delays.items()):
            sizes = "any size" if bits == 0 else f"size {1 << (bits - 1)}-{(1 << bits) - 1}"
            out[f"{path} {sizes}"] = round(d, 4)
        return out

    def earn(self) -> None:
        """A first request was sent: the budget grows by ``BUDGET`` (up to ``BURST``)."""
        self._tokens = min(self.BURST, self._tokens + self.BUDGET)

    def can_spend(self) -> bool:
        return self._tokens >= 1.0 - 1e-9  # ten earnings of 0.1 sum to 0.999...

    def spend(self, overdue: bool = False) -> bool:
        """Take one hedge from the budget; False when it is spent, unless the request
        is ``overdue`` (has waited ``OVERDUE`` times its delay: then free)."""
        if self.can_spend():
            self._tokens = max(0.0, self._tokens - 1.0)
            return True
        return overdue


def quantile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (the smallest value with at least ``q`` of them at
    or below it: no interpolation, so it is always a latency that was observed)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date)."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # asctime's form, or "-0000": GMT all the same (RFC 9110), never local time
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True, slots=True)
class CallRecord:
    """What one call cost beyond its answer; attached to every completion as
    ``completion.meta["http"]`` so an engine can total it across processes.

    ``errors``: one ``(cause, seconds lost)`` per failed attempt, in order; seconds lost
    run from the attempt's start to the next attempt's start (or to the end of a call
    that gave up), so they include the backoff wait. ``failed``: the cause of the last
    attempt when the call gave up, else None; ``deadline``: the call ended because its
    deadline passed. ``hedges``: copies sent beside an attempt's first request;
    ``hedge_won``: the answer came from one of them, and ``hedge_s`` is then what the
    slow request cost: the seconds from its send to the send of the copy that answered.
    """

    attempts: int
    elapsed_s: float
    errors: tuple[tuple[str, float], ...] = ()
    failed: str | None = None
    deadline: bool = False
    hedges: int = 0
    hedge_won: bool = False
    hedge_s: float = 0.0


class ClientStats:
    """Totals over :class:`CallRecord` s: one per client, or across rollouts by an engine.

    :meth:`as_dict` fields: ``calls`` (finished calls, answered or not), ``attempts``
    (first requests and retries; hedges not included), ``retries`` (failed attempts that
    were retried, by cause), ``failed_calls`` (calls that gave up, by the cause of their
    last attempt, or ``rejected``: a 4xx the client does not retry), ``lost_s`` (seconds
    lost to failed attempts and their waits, by cause), ``deadline_exceeded`` (calls
    ended by their deadline), ``hedges`` (copies sent beside first requests and
    retries), ``hedge_wins`` (answers that came from a hedge) and ``hedge_lost_s``
    (seconds the requests those hedges overtook had waited).
    """

    def __init__(self) -> None:
        self.calls = 0
        self.attempts = 0
        self.retries: Counter[str] = Counter()
        self.failed_calls: Counter[str] = Counter()
        self.lost_s: defaultdict[str, float] = defaultdict(float)
        self.deadline_exceeded = 0
        self.hedges = 0
        self.hedge_wins = 0
        self.hedge_lost_s = 0.0

    def add(self, record: CallRecord) -> None:
        self.calls += 1
        self.attempts += record.attempts
        retried = record.errors[:-1] if record.failed is not None else record.errors
        for cause, _ in retried:
            self.retries[cause] += 1
        for cause, lost in record.errors:
            self.lost_s[cause] += lost
        if record.failed is not None:
            self.failed_calls[record.failed] += 1
        self.deadline_exceeded += record.deadline
        self.hedges += record.hedges
        self.hedge_wins += record.hedge_won
        self.hedge_lost_s += record.hedge_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "attempts": self.attempts,
            "retries": dict(self.retries),
            "failed_calls": dict(self.failed_calls),
            "lost_s": {k: round(v, 6) for k, v in self.lost_s.items()},
            "deadline_exceeded": self.deadline_exceeded,
            "hedges": self.hedges,
            "hedge_wins": self.hedge_wins,
            "hedge_lost_s": round(self.hedge_lost_s, 6),
        }
