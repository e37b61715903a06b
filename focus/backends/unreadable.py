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
  answers, once a second request has been answered the same way (with one call in
  flight at a time, that is after the first call's retries and reruns);
* or, after good answers, :data:`Unreadable.LATER` answers in a row share a cause and
  answered at least :data:`Unreadable.REQUESTS` different requests: a server swapped
  for another kind mid-run. One request answered badly again and again (its seeded
  sample is the same each time) is not enough: that is a bad response of that
  rollout, run again and counted (:class:`focus.execution.BadResponses`).

With faults injected at a rate ``r`` split over ``k`` causes, ``FIRST`` answers in a
row of one cause happen with probability about ``(r / k) ** 5`` at the start (1e-5 at
r = 0.1, one cause), and a good answer between any two resets the count.
"""

from __future__ import annotations

import re

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

    __slots__ = ("answers", "key", "last", "never_answered", "requests")

    def __init__(self) -> None:
        self.never_answered = True
        self.key: str | None = None
        #: The last malformed answer's cause, as the client named it.
        self.last = ""
        self.answers = 0
        self.requests: set[int] = set()

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
