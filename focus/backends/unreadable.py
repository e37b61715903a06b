"""Telling an answer format the client cannot read from a passing malformed answer.

A malformed answer (a 2xx the client cannot parse or trust) is retried: a server that
ends a sample itself (an abort during a weights update), a body cut mid-way, a garbled
byte are faults that pass. A server that answers in a shape the client does not read -
SGLang's ``/v1/completions`` with token texts and no ids behind ``model.kind = openai``,
a server that gives no log-probs - answers every request the same malformed way, and
retrying it cost every call ``max_retries`` attempts (20-28 s with the default backoff)
before the wave failed as a "model service outage", the cause at the end of the line.

:class:`Unreadable` counts, per client and process, the malformed answers in a row
since the client's last good answer that share one cause (the message with numbers
and quoted parts blanked, so "token 'a'" and "token 'b'" are one cause, while garbled
bodies, each cut at another place, differ), and the different requests (bodies) they
answered. It says stop when

* the client has had no good answer in this process and :data:`Unreadable.FIRST`
  answers in a row share a cause and answered at least two different requests: a
  collection that starts against a server of another shape stops within its first few
  answers, once a second request has been answered the same way;
* or, after good answers, :data:`Unreadable.LATER` answers in a row share a cause and
  answered at least :data:`Unreadable.REQUESTS` different requests: a server swapped
  for another kind mid-run. One request answered badly again and again (its seeded
  sample is the same each time) is not enough: that is a bad response of that
  rollout, run again and counted (:class:`focus.execution.BadResponses`).

With faults injected at a rate ``r`` split over ``k`` causes, ``FIRST`` answers in a
row of one cause happen with probability about ``(r / k) ** 5`` at the start (1e-5 at
r = 0.1, one cause), and a good answer between any two resets the count.

With one call in flight (``execution.max_concurrency = 1``, one task with one rollout)
the second request came only after the first one's retries and its rollout's reruns:
24-39 s with the default backoff. So, while nothing has been read yet, once one
request has had :data:`Unreadable.PROBE_AFTER` answers in a row of one cause, the
client sends a *probe* beside it (:func:`probe`): one request of the same kind, with
the same settings, to another prompt (the request's first :data:`PROBE_TOKENS` tokens)
and another seed (:func:`focus.backends.openai_compat.probe_body`). Its answer is
counted like any other and dropped (never a turn). The same malformed answer makes it
the second request the rule needs, and the request's next retries bring the count to
``FIRST``: a stop in under a second. A good one means the server's answers can be
read, and the request is retried as before (its rollout's bad response if it
persists). A probe that gets no answer, or is refused, tells nothing; at most
:data:`Unreadable.PROBES` are sent, one at a time. The rule is unchanged, and so is
what a request whose answer was malformed by chance is allowed: fewer than ``FIRST``
answers in a row of one cause, the probe's included. What changes is when they come:
at once, as with many calls in flight, not spread over 30 s of retries, so malformed
answers to every request for a moment at the start of a process (none was ever seen,
but a fault proxy's queue is one) stop it at any concurrency now.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from focus.backends.wire import Rejected, Retryable

log = logging.getLogger(__name__)

#: A probe's prompt: the first this many tokens of the request it stands beside.
PROBE_TOKENS = 16


def other_seed(seed: int | None) -> int:
    """A probe's seed: another than its request's (an unseeded request's probe is seeded,
    so that the two bodies differ even where the prompt is shorter than a probe's)."""
    return 1 if seed is None else seed ^ 1


_BLANK = re.compile(r"'[^']*'|\"[^\"]*\"|-?\d+(?:\.\d+)?(?:e-?\d+)?")


def cause_key(cause: str) -> str:
    """``cause`` with numbers and quoted parts blanked: one key for every answer that
    breaks the same rule the same way."""
    return _BLANK.sub("#", cause)[:300]


class Unreadable:
    """Malformed answers in a row with one cause since the last good answer (see module)."""

    FIRST = 5
    LATER = 16
    REQUESTS = 3
    #: Malformed answers in a row of one cause, all to one request, before a probe.
    PROBE_AFTER = 2
    #: Probes sent at most before a first good answer (one that gets no answer, or
    #: another cause, tells nothing; the next may).
    PROBES = 3

    __slots__ = ("answers", "key", "last", "never_answered", "probes", "probing", "requests")

    def __init__(self) -> None:
        self.never_answered = True
        self.key: str | None = None
        #: The last malformed answer's cause, as the client named it.
        self.last = ""
        self.answers = 0
        self.requests: set[int] = set()
        self.probes = 0
        #: A probe is in flight (one at a time).
        self.probing = False

    def answered(self) -> None:
        """A good answer: the count starts again."""
        self.never_answered = False
        self.key, self.answers = None, 0
        self.requests.clear()

    def malformed(self, cause: str, content: bytes | None) -> bool:
        """A malformed answer with ``cause`` to the request ``content``: True when the
        answers cannot be read (stop instead of retrying)."""
        key = cause_key(cause)
        self.last = cause.removeprefix("malformed response: ")
        if key != self.key:
            self.key, self.answers = key, 0
            self.requests.clear()
        self.answers += 1
        if len(self.requests) < self.REQUESTS:
            self.requests.add(hash(content))
        if self.never_answered:
            return self.answers >= self.FIRST and len(self.requests) >= 2
        return self.answers >= self.LATER and len(self.requests) >= self.REQUESTS

    def take_probe(self) -> bool:
        """Whether to send a probe now (and count it sent): nothing read yet, no probe in
        flight, and the answers in a row so far all to one request."""
        if not self.never_answered or self.probing or self.probes >= self.PROBES:
            return False
        if self.answers < self.PROBE_AFTER or len(self.requests) != 1:
            return False
        self.probes += 1
        self.probing = True
        return True


async def probe(
    tally: Unreadable, make: Callable[[Any], Any], content: bytes, send: Callable[[bytes], Awaitable[object]]
) -> bool:
    """Send a probe beside the request ``content`` (``make``: its body from the
    request's) with ``send`` (one attempt, no retry) and count its answer in ``tally``:
    True when the answers cannot be read. The answer's value is dropped."""
    try:
        other = json.dumps(make(json.loads(content)), separators=(",", ":")).encode()
    except (KeyError, TypeError, ValueError):  # a body of a kind ``make`` does not know (a subclass's): no probe
        tally.probing = False
        return False
    log.info("one request got the same malformed answer %d times: probing with another (%s)", tally.answers, tally.last)
    try:
        await send(other)
    except Retryable as e:
        return e.kind == "malformed response" and tally.malformed(str(e), other)
    except Rejected:
        return False
    finally:
        tally.probing = False
    tally.answered()
    return False


def unreadable_line(service: str, method: str, url: object, tally: Unreadable) -> str:
    """The one line that stops a collection whose answers cannot be read: the cause first."""
    hint = (
        "is model.kind right (openai for /v1/completions, sglang for /generate) and does the server return "
        "token ids and log-probs?"
        if service == "model service"
        else "is it the kind of service the client expects?"
    )
    return (
        f"the {service}'s answers cannot be read: {tally.last}; {hint} "
        f"({tally.answers} answers in a row to {method} {url} broke this rule"
        f"{', none readable yet' if tally.never_answered else ''})"
    )
