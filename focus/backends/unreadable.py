"""Telling an answer format the client cannot read from a passing malformed answer.

A malformed answer (a 2xx the client cannot parse or trust) is retried: a server that
ends a sample itself (an abort during a weights update), a body cut mid-way, a garbled
byte are faults that pass. A server that answers in a shape the client does not read -
SGLang's ``/v1/completions`` with token texts and no ids behind ``model.kind = openai``,
a server that gives no log-probs - answers every request the same malformed way, and
retrying it cost every call ``max_retries`` attempts (20-28 s with the default backoff)
before the wave failed as a "model service outage", the cause at the end of the line.

A sample the server ended itself (``finish_reason`` ``abort``,
:class:`~focus.backends.http.Aborted`) is retried and never counted here: an SGLang
weights update with ``abort_all_requests`` ends every request in flight at once, each
answered on its retry, and 5 such answers in a row before any good one (16 after)
stopped the collection as unreadable. A server that aborts one request on every try
still fails that call after its retries, as any bad response does.

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
24-39 s with the default backoff. So, once one request has had
:data:`Unreadable.PROBE_AFTER` answers in a row of one cause, the client sends a
*probe* beside it (:func:`probe`): a request of the same kind, with the same settings,
to another prompt (the request's first :data:`PROBE_TOKENS` tokens) and another seed
(:func:`focus.backends.openai_compat.probe_body`). Its answer is counted like any other
and dropped (never a turn). A good one means the server's answers can be read: the
count starts again and the request is retried as before (its rollout's bad response
if it persists), with no more probes beside it. A probe that gets no answer, or is
refused, tells nothing. Probes go one at a time, and stand in for the other calls in
flight that a higher concurrency would have:

* while nothing has been read, one probe, at most :data:`Unreadable.PROBES` in the
  process: the same malformed answer makes it the second request the rule needs, and
  the request's next retries bring the count to ``FIRST``: a stop in under a second;
* after good answers (a server swapped mid-run), ``REQUESTS - 1`` probes beside each
  malformed answer of the request, each to its own prompt and seed, at most
  :data:`Unreadable.LATER` between good answers: the same malformed answers make them
  the other requests the rule needs, and with the request's retries the count reaches
  ``LATER`` within its first few retries (their backoff: well under a second by
  default) instead of after its rollout's reruns (32-41 s, then as a model-service outage).
  The answers come at the pace of the request's retries, as three calls' would, so a
  server that answers badly for a moment (a weights update aborting its requests) is
  given that time.

The rule is unchanged, and so is what a request whose answer was malformed by chance is
allowed: fewer than ``FIRST`` (``LATER``) answers in a row of one cause, the probes'
included. What changes is when they come: at once, as with many calls in flight, not
spread over 30 s of retries, so malformed answers to every request for a moment (none
was ever seen, but a fault proxy's queue is one) stop it at any concurrency now.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from focus.backends.wire import Rejected, Retryable, encode

log = logging.getLogger(__name__)

#: A probe's prompt: the first this many tokens of the request it stands beside.
PROBE_TOKENS = 16


def other_seed(seed: int | None, k: int = 1) -> int:
    """The ``k``-th probe's seed (1-based): another than its request's and the other
    probes' (an unseeded request's probes are seeded, so that the bodies differ even
    where the prompt is shorter than a probe's)."""
    return k if seed is None else seed ^ k


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

    __slots__ = (
        "answers",
        "beside",
        "cleared",
        "key",
        "last",
        "never_answered",
        "probes",
        "probing",
        "requests",
        "sent",
    )

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
        #: After good answers: the request probed beside, and the probes sent since the last good answer.
        self.beside: int | None = None
        self.sent = 0
        #: The request a probe read fine beside: its bad answers are its own, no more probes.
        self.cleared: int | None = None

    def answered(self, cleared: bytes | None = None) -> None:
        """A good answer (``cleared``: a probe's, beside that request): the count starts again."""
        self.never_answered = False
        self.key, self.answers = None, 0
        self.requests.clear()
        self.beside, self.sent = None, 0
        if cleared is not None:
            self.cleared = hash(cleared)

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

    def take_probe(self, content: bytes) -> int:
        """How many probes to send beside the request ``content`` now, one after another
        (0: none; counted sent): no probe in flight, ``PROBE_AFTER`` answers in a row,
        none read fine beside this request, and the answers so far all to it (and, after
        good answers, to its probes). See the module docs for how many, and the limits."""
        request = hash(content)
        if self.probing or self.answers < self.PROBE_AFTER or request == self.cleared:
            return 0
        if self.never_answered:
            if self.probes >= self.PROBES or len(self.requests) != 1:
                return 0
            self.probes, n = self.probes + 1, 1
        else:
            if self.beside is None and len(self.requests) == 1:
                self.beside = request
            if self.beside != request or self.sent >= self.LATER:
                return 0
            n = min(self.REQUESTS - 1, self.LATER - self.sent)
            self.sent += n
        self.probing = True
        return n


async def probe(
    tally: Unreadable,
    make: Callable[[Any, int], Any],
    content: bytes,
    send: Callable[[bytes], Awaitable[object]],
    n: int = 1,
) -> bool:
    """Send ``n`` probes beside the request ``content``, one at a time (``make(body, k)``:
    the ``k``-th one's body from the request's, 1-based), each with ``send`` (one
    attempt, no retry), and count their answers in ``tally``: True when the answers
    cannot be read. A good answer ends it (the request's bad answers are its own). The
    answers' values are dropped."""
    try:
        body = json.loads(content)
        others = [encode(make(body, k)) for k in range(1, n + 1)]
    except (KeyError, TypeError, ValueError):  # a body of a kind ``make`` does not know (a subclass's): no probe
        tally.probing = False
        return False
    log.info("one request got the same malformed answer %d times: probing with another (%s)", tally.answers, tally.last)
    try:
        for other in others:
            try:
                await send(other)
            except Retryable as e:
                if e.kind == "malformed response" and not e.aborted and tally.malformed(str(e), other):
                    return True
                continue
            except Rejected:
                continue
            tally.answered(cleared=content)
            return False
        return False
    finally:
        tally.probing = False


def unreadable_line(service: str, method: str, url: object, tally: Unreadable) -> str:
    """The one line that stops a collection whose answers cannot be read: the cause first."""
    hint = (
        "is model.kind right (openai: /v1/completions, sglang: /generate, llamacpp: llama-server's /completion) "
        "and does the server return token ids and log-probs?"
        if service == "model service"
        else "is it the kind of service the client expects?"
    )
    return (
        f"the {service}'s answers cannot be read: {tally.last}; {hint} "
        f"({tally.answers} answers in a row to {method} {url} broke this rule"
        f"{', none readable yet' if tally.never_answered else ''})"
    )
