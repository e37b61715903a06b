"""A wave whose every request the model service refused: a setting to fix, not a batch.

A 4xx is not retried, so a service that refuses every request fails each rollout at
once. The collection used to finish with an empty batch, marked finished, so a rerun
after fixing the setting returned the same empty batch (or the id was spent). A wave
refused whole is therefore kept out of the batch and stops the collection unfinished
(:class:`RequestsRefused`): a rerun with the same collection id collects.

Two kinds of refusal say so. A status that refuses any request whatever it holds
(:data:`REFUSED_STATUSES`: the key, the path, the model name) stops a wave refused
whole. A 400 or 422 may be one request's own (its prompt), so it stops a wave only when
every one of at least :data:`SAME_REFUSAL_MIN` rollouts got the same refusal, word for
word, and it is not a prompt over the context (which the agent truncates instead): a
sampling setting the server refuses (a temperature outside its range, a ``top_k`` it
does not take) is carried by every request and refused the same way each time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from focus.agent import Rollout

#: Statuses that refuse any request, whatever its prompt: 401/403 (the key), 404 (the
#: path or the model name), 405 (not a generation endpoint), 501/505 (a server that cannot
#: do it, ``retry.NEVER_RETRY_5XX``). A 400 or 413 may be the request's own (its length).
REFUSED_STATUSES = frozenset({401, 403, 404, 405, 501, 505})
#: Statuses of a request the server found invalid: its prompt's, or a setting's that every
#: request carries (told apart by every rollout of a wave getting the same refusal).
SETTING_STATUSES = frozenset({400, 422})
#: The fewest rollouts whose identical 400/422 refusal stops a wave (one rollout's refusal
#: is its own prompt's as likely as a setting's).
SAME_REFUSAL_MIN = 2
_REJECTED = re.compile(r"rejected with status (\d{3})")


class RequestsRefused(RuntimeError):
    """The model service refused every request of a wave, for a reason no rerun of a
    rollout changes: a status that does not depend on what the request holds
    (:data:`REFUSED_STATUSES`: a wrong API key, path or model name), or the same 400/422
    for every rollout (a sampling setting the server does not take). The wave keeps
    nothing and the collection stops unfinished: a rerun after fixing the setting
    collects with the same collection id."""


def refused_status(rollout: Rollout) -> int | None:
    """The status with which the model service refused ``rollout``'s request (its leaf's
    cause, as :mod:`focus.backends.http` words it), or None."""
    leaf = rollout.leaf if isinstance(rollout, Rollout) else None
    if leaf is None or leaf.kind != "failed" or not leaf.cause.startswith("model:"):
        return None
    m = _REJECTED.search(leaf.cause)
    return int(m.group(1)) if m else None


def check_refused(rollouts: Sequence[Rollout]) -> None:
    """Raise :class:`RequestsRefused` if every one of ``rollouts`` was refused with one
    of :data:`REFUSED_STATUSES`, or, at least :data:`SAME_REFUSAL_MIN` of them, all with
    the same 400/422 refusal that is not a prompt over the context."""
    if not rollouts:
        return
    statuses = [refused_status(r) for r in rollouts]
    if all(s in REFUSED_STATUSES for s in statuses):
        what = "check model.url, model.model and the API key (focus.backends.HttpConfig.api_key)"
    elif _same_setting_refusal(rollouts, statuses):
        what = "a setting every request carries, most often a sampling parameter (agent.sampling.*, model.options)"
    else:
        return
    n = len(rollouts)
    last = rollouts[-1].leaf
    assert last is not None  # every rollout was refused, so each has a failed leaf
    raise RequestsRefused(
        f"the model service refused every request ({n} of {n} rollouts of the wave, status "
        f"{'/'.join(str(s) for s in sorted({s for s in statuses if s is not None}))}): {what}; nothing of the wave is kept and the "
        f"collection is not finished, so a rerun with the same collection id collects; last: "
        f"{last.cause.removeprefix('model: ')}"
    )


def _same_setting_refusal(rollouts: Sequence[Rollout], statuses: list[int | None]) -> bool:
    """Whether every rollout got the same 400/422 refusal, word for word, from at least
    :data:`SAME_REFUSAL_MIN` of them, and it is not a prompt over the context."""
    from focus.backends.wire import is_context_limit

    if len(rollouts) < SAME_REFUSAL_MIN or len(set(statuses)) != 1 or statuses[0] not in SETTING_STATUSES:
        return False
    causes = {r.leaf.cause for r in rollouts if r.leaf is not None}
    if len(causes) != 1:
        return False
    (cause,) = causes
    return not is_context_limit(statuses[0], cause)
