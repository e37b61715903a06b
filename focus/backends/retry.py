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
* the whole call, attempts and waits together, ends by ``deadline_s``: a retry that
  could not finish in time is not started;
* optionally a *hedge*: when an attempt has not answered after ``hedge_after_s``, an
  identical second request is sent and the first good answer wins. The client hedges
  only requests whose answer does not depend on which copy answers (a seeded sample,
  a critic score): taking the faster of two unseeded samples would favour short ones.

This module holds the policy and the pure decisions (backoff, ``Retry-After``) and the
per-call :class:`CallRecord` with its tally :class:`ClientStats`; it imports nothing but
pydantic, so configuration code can use it without loading an HTTP stack.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: Why an attempt failed and was (or could have been) retried. ``server error``: status
#: 408, 409, 425, 429 or any 5xx; ``timeout``: no answer within the attempt's time;
#: ``connection``: refused, reset or closed before the answer; ``malformed response``:
#: a 2xx whose body is not JSON or not what the API promises (ids and log-probs that
#: do not line up, non-finite log-probs, a critic answer of the wrong length).
CAUSES = ("server error", "timeout", "connection", "malformed response")

RETRY_STATUSES = frozenset({408, 409, 425, 429})


def is_retry_status(status: int) -> bool:
    """Statuses that say "try again later" rather than "this request is wrong"."""
    return status in RETRY_STATUSES or status >= 500


class RetryPolicy(BaseModel):
    """How long to wait and how often to try again: one policy for every HTTP client.

    Set from a config file as ``model.http`` / ``critic.http`` (see docs/operations.md,
    "Timeouts and retries").
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Seconds one attempt waits for its answer; a long generation needs a long timeout.
    timeout_s: float = Field(120.0, gt=0)
    #: Seconds to open a connection (part of an attempt's ``timeout_s`` too).
    connect_timeout_s: float = Field(5.0, gt=0)
    #: Retries after the first attempt (so ``max_retries + 1`` attempts at most).
    max_retries: int = Field(4, ge=0)
    #: Backoff cap before retry ``n`` (0-based) is ``min(backoff_max_s, backoff_s * 2**n)``.
    backoff_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)
    #: Full jitter: wait a uniform draw from ``[0, cap]``; False waits exactly ``cap``.
    jitter: bool = True
    #: Seconds one call may take, every attempt and wait included; None: no limit
    #: beyond the attempts. A retry that cannot finish by then is not started.
    deadline_s: float | None = Field(600.0, gt=0)
    #: Send a second identical request when an attempt has not answered after this
    #: many seconds (if shorter than ``timeout_s``), and take the first good answer;
    #: None: never hedge.
    hedge_after_s: float | None = Field(None, gt=0)

    def backoff(self, retry: int, rng: random.Random, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based).

        A server's ``Retry-After`` raises the wait to at least what it asked, up to
        ``backoff_max_s`` (a server asking for an hour must not stall a collection;
        the deadline ends the call instead)."""
        cap = min(self.backoff_max_s, self.backoff_s * 2.0**retry)
        wait = rng.uniform(0.0, cap) if self.jitter else cap
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.backoff_max_s))
        return wait


class HttpConfig(RetryPolicy):
    """A client's retry policy plus its connection settings."""

    #: Requests in flight at once from this client (per event loop); hedges count too.
    max_concurrency: int = Field(64, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)
    api_key: str | None = None


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
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass(frozen=True)
class CallRecord:
    """What one call cost beyond its answer; attached to every completion as
    ``completion.meta["http"]`` so an engine can total it across processes.

    ``errors``: one ``(cause, seconds lost)`` per failed attempt, in order; seconds lost
    run from the attempt's start to the next attempt's start (or to the end of a call
    that gave up), so they include the backoff wait. ``failed``: the cause of the last
    attempt when the call gave up, else None; ``deadline``: the call ended because its
    deadline passed. ``hedges``: second requests sent; ``hedge_won``: the answer came
    from one of them.
    """

    attempts: int
    elapsed_s: float
    errors: tuple[tuple[str, float], ...] = ()
    failed: str | None = None
    deadline: bool = False
    hedges: int = 0
    hedge_won: bool = False


class ClientStats:
    """Totals over :class:`CallRecord` s: one per client, or across rollouts by an engine.

    :meth:`as_dict` fields: ``calls`` (finished calls, answered or not), ``attempts``
    (first requests and retries; hedges not included), ``retries`` (failed attempts that
    were retried, by cause), ``failed_calls`` (calls that gave up, by the cause of their
    last attempt, or ``rejected``: a 4xx the client does not retry), ``lost_s`` (seconds lost to failed attempts and their waits, by
    cause), ``deadline_exceeded`` (calls ended by their deadline), ``hedges`` (second
    requests sent) and ``hedge_wins`` (answers that came from a hedge).
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
        }
