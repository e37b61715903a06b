"""A wave whose every rollout failed alike: a setting or code to fix, not a batch.

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
does not take) is carried by every request and refused the same way each time. A
prompt over the context at a task's opening prompt, before any turn, is that task's for
good (past its first turn the agent truncates the episode instead): the task is left
out, named in one warning line, its root started no more, and the collection goes on
with the others; only where every task is so does it stop
(:func:`check_tasks_refused`).

An env that fails every fresh episode of a wave the same way (at least
:data:`SAME_ENV_FAILURE_MIN` of them, from two tasks or more, numbers and quoted parts
aside: a bug at one step of every task, a service the env calls that is gone) is
:class:`BrokenEnv`, which stops the collection the same way. It used to spend the whole budget on continuations that
failed at the same step, one warning a wave, and finish with a batch of truncated
segments under a spent id.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from focus.agent import Piece, Rollout
from focus.tree import Node, Tree
from focus.usage import failure_kind

#: Statuses that refuse any request, whatever its prompt: a redirect (3xx: the URL,
#: :func:`focus.backends.wire.redirected`), 401/403 (the key), 404 (the path or the model
#: name), 405 (not a generation endpoint), 501/505 (a server that cannot do it,
#: ``retry.NEVER_RETRY_5XX``). A 400 or 413 may be the request's own (its length).
REFUSED_STATUSES = frozenset({301, 302, 303, 307, 308, 401, 403, 404, 405, 501, 505})
#: Statuses of a request the server found invalid: its prompt's, or a setting's that every
#: request carries (told apart by every rollout of a wave getting the same refusal).
SETTING_STATUSES = frozenset({400, 422})
#: The fewest rollouts whose identical 400/422 refusal stops a wave (one rollout's refusal
#: is its own prompt's as likely as a setting's).
SAME_REFUSAL_MIN = 2
#: The fewest rollouts of a wave whose env failures, all alike, stop it. A wave's
#: rollouts span its tasks and checkpoints, so four alike are a rule of the env, not
#: one task's bad luck.
SAME_ENV_FAILURE_MIN = 4
_REJECTED = re.compile(r"rejected with status (\d{3})")
log = logging.getLogger("focus.collector")


class RequestsRefused(RuntimeError):
    """The model service refused every request of a wave, for a reason no rerun of a
    rollout changes: a status that does not depend on what the request holds
    (:data:`REFUSED_STATUSES`: a wrong API key, path or model name), or the same 400/422
    for every rollout (a sampling setting the server does not take). The wave keeps
    nothing and the collection stops unfinished: a rerun after fixing the setting
    collects with the same collection id."""


class BrokenEnv(RuntimeError):
    """Every fresh episode of a wave (at least :data:`SAME_ENV_FAILURE_MIN`, from two
    tasks or more) failed in the env with one cause, numbers and quoted parts aside: the env's code, or a service it
    calls, fails whatever the policy does. The wave keeps nothing and the collection
    stops unfinished: a rerun after the fix collects with the same collection id."""


def check_env_failures(rollouts: Sequence[Rollout], jobs: Sequence[Any]) -> None:
    """Raise :class:`BrokenEnv` if the rollouts of ``jobs`` (aligned) that start at a
    task's root, at least :data:`SAME_ENV_FAILURE_MIN` of them from two tasks or more,
    all failed in the env (cause ``env: ...``) with one cause, numbers and quoted parts
    aside (the task's id, an index, a time).

    Fresh episodes only: a continuation starts where the search chose, and a wave of
    continuations from checkpoints that all lead to a state the env cannot step from (a
    tool that crashes on one input) fails alike though the env serves every other state.
    """
    from focus.backends.unreadable import cause_key

    fresh = [r for r, j in zip(rollouts, jobs, strict=True) if j.start.steps == 0]
    if len(fresh) < SAME_ENV_FAILURE_MIN or len({r.task_id for r in fresh}) < 2:
        return
    keys = set()
    for r in fresh:
        if r.leaf.kind != "failed" or failure_kind(r.leaf.cause) != "env":
            return
        keys.add(cause_key(r.leaf.cause))
        if len(keys) > 1:
            return
    last = fresh[-1]
    n, tasks = len(fresh), len({r.task_id for r in fresh})
    raise BrokenEnv(
        f"the env failed every fresh episode of the wave the same way ({n} of {n} rollouts from the root, {tasks} "
        "tasks): fix the env or the service it calls; nothing of the wave is kept and the collection is not "
        f"finished, so a rerun with the same collection id collects; last (task {last.task_id!r}, step "
        f"{last.leaf.steps}): {last.leaf.cause.removeprefix('env: ')}"
    )


def rejected_status(text: str) -> int | None:
    """The status of a refusal as :mod:`focus.backends.http` words it in ``text``, or None."""
    m = _REJECTED.search(text)
    return int(m.group(1)) if m else None


def refused_status(rollout: Rollout) -> int | None:
    """The status with which the model service refused ``rollout``'s request (its leaf's
    cause), or None."""
    leaf = rollout.leaf if isinstance(rollout, Rollout) else None
    if leaf is None or leaf.kind != "failed" or not leaf.cause.startswith("model:"):
        return None
    return rejected_status(leaf.cause)


def check_refused(rollouts: Sequence[Rollout]) -> None:
    """Raise :class:`RequestsRefused` if every one of ``rollouts`` was refused with one
    of :data:`REFUSED_STATUSES`, or, at least :data:`SAME_REFUSAL_MIN` of them, all with
    the same 400/422 refusal that is not a prompt over the context."""
    if not rollouts:
        return
    statuses = [refused_status(r) for r in rollouts]
    n = len(rollouts)
    last = rollouts[-1].leaf
    if all(s in REFUSED_STATUSES for s in statuses):
        what = "check model.url, model.model and the API key (model.api_key_env; focus.backends.HttpConfig.api_key in the library)"
    elif _same_setting_refusal(rollouts, statuses):
        what = "a setting every request carries, most often a sampling parameter (agent.sampling.*, model.options)"
    else:
        return
    assert last is not None  # every rollout was refused, so each has a failed leaf
    raise RequestsRefused(
        f"the model service refused every request ({n} of {n} rollouts of the wave, status "
        f"{'/'.join(str(s) for s in sorted({s for s in statuses if s is not None}))}): {what}; nothing of the wave is kept and the "
        f"collection is not finished, so a rerun with the same collection id collects; last: "
        f"{last.cause.removeprefix('model: ')}"
    )


def refused_opening(kind: str, steps: int, cause: str | None) -> bool:
    """Whether a leaf (its kind, steps and cause) is a task's opening prompt refused as
    over the model's context, before any turn: the server's refusal (a 400 or 413 in its
    words, :func:`focus.backends.wire.is_context_limit`) or the agent's own
    ``max_prompt_tokens`` (``focus.agent``). Past the opening prompt the agent ends such a
    rollout in a truncated leaf instead; at it the task cannot be sampled on any rerun,
    so the search continues such a root no more (``focus.search.grafting``)."""
    if kind != "failed" or steps != 0 or not cause or not cause.startswith("model:"):
        return False
    m = _REJECTED.search(cause)
    if m is None:
        return "over max_prompt_tokens" in cause  # the agent's limit (agent.py)
    from focus.backends.wire import is_context_limit

    return is_context_limit(int(m.group(1)), cause)


def opening_refusal(tree: Tree, children: Sequence[int]) -> Node | None:
    """The leaf of the first of ``children`` (the root's edges, in order) refused at the
    task's opening prompt (:func:`refused_opening`), where every rollout before it ended
    without a turn (failed otherwise, say a refusal of its own); else None. Grafting takes
    the root's branch state when it adds that leaf (``focus.search.grafting``): a first
    rollout that failed otherwise left the root started again on every later wave, each
    refused. A root with a turn before proves its prompt fits; one whose first refusal
    came before (a collection started before the refusal was read, whose root kept its
    state) keeps it, so the waves it recorded are planned again as they were."""
    for eid in children:
        edge = tree.edges[eid]
        if edge.turns:
            return None
        node = tree.nodes[edge.child]
        if refused_opening(node.kind, node.steps, node.cause):
            return node
    return None


def refused_task(tree: Tree) -> Node | None:
    """The leaf that refused ``tree``'s task (:func:`opening_refusal`) where grafting took
    the root's branch state for it, so the task gets no rollout more (its prompt is the
    same on every one); else None."""
    root = tree.root
    if not root.children or tree.ROOT in tree.states:
        return None
    return opening_refusal(tree, root.children)


#: The model's context as a refusal words it (vLLM, its engine, SGLang, its scheduler),
#: or the agent's ``max_prompt_tokens``.
_CONTEXT = re.compile(
    r"maximum context length is (\d+)|maximum model length of (\d+)|model's context length \((\d+)"
    r"|maximum allowed length \((\d+)|over max_prompt_tokens (\d+)"
)


def _named(refused: Sequence[tuple[str, Node | Piece]]) -> str:
    """``task '<id>' (<n> prompt tokens[; the limit is M])`` for each (task id, refused
    leaf) (the limit where the refusal says it: the server's context, or
    ``max_prompt_tokens``)."""
    parts = []
    for task_id, leaf in refused:
        m = _CONTEXT.search(leaf.cause or "")
        limit = next((g for g in m.groups() if g), None) if m else None
        reads = f"; the limit is {limit}" if limit else ""
        parts.append(f"task {task_id!r} ({len(leaf.context_ids)} prompt tokens{reads})")
    return ", ".join(parts)


def left_out_line(refused: Sequence[tuple[str, Node | Piece]], others: int | None = None) -> str:
    """The warning line for tasks found over the model's context at their opening prompt
    (each a task id and its refused leaf), ``others`` the tasks the collection goes on
    with, where known: the library's (:func:`check_tasks_refused`) and the pipeline's
    console's (``tasks.records``) words."""
    tail = f"; the collection goes on with the other {others}" if others is not None else ""
    return f"{len(refused)} task(s) left out, their opening prompt over the model's context: {_named(refused)}{tail}"


def refused_tasks(trees: Sequence[Tree]) -> list[tuple[str, Node]]:
    """(task id, refused leaf) of each of ``trees`` refused at its opening prompt (:func:`refused_task`)."""
    return [(t.task_id, leaf) for t in trees if (leaf := refused_task(t)) is not None]


def check_tasks_refused(before: Sequence[Tree], after: Sequence[Tree]) -> None:
    """Log one WARNING line naming the tasks a wave found over the model's context at
    their opening prompt (``before`` and ``after``: the trees without and with it), and
    raise :class:`RequestsRefused` where every task of the collection is so: nothing
    could be collected. A refused task's root is not started again (its prompt is the
    same on every rollout); it used to be, every wave, and a wave of nothing else stopped
    the collection although the other tasks had good data."""
    new = [ti for ti, t in enumerate(after) if refused_task(t) is not None and refused_task(before[ti]) is None]
    if not new:
        return
    every = refused_tasks(after)
    if len(every) == len(after):
        n = len(after)
        raise RequestsRefused(
            f"every task's opening prompt ({n} of {n}) was refused as over the model's context: {_named(every)}; "
            "those tasks cannot be sampled with this model (serve a longer context, e.g. vLLM's --max-model-len, or "
            "shorten their prompts: the system prompt, the task's text, agent.max_prompt_tokens); nothing of the wave "
            "is kept and the collection is not finished, so a rerun with the same collection id collects"
        )
    log.warning(left_out_line(refused_tasks([after[ti] for ti in new]), len(after) - len(every)))


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
