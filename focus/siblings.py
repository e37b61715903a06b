"""Rollouts that start together from one state: their first model calls as one request.

The continuations of one checkpoint all begin with the same prompt, the checkpoint's.
The search gives them consecutive seeds (:func:`focus.search.rollout_seed`: a hash of
the checkpoint plus the branch index) and the agent samples a rollout's first call with
the rollout's own seed (:meth:`focus.agent.Agent.rollout`), so siblings launched in one
wave make first calls that differ only in consecutive seeds: what one request with ``n``
samples gives on a server that samples ``i`` with ``seed + i``, as vLLM does
(:meth:`focus.policy.Policy.sample_siblings`). One request instead of ``n`` saves the
client a round trip per sibling (most of FOCUS's continuations are one or two calls
long, so first calls are most calls) and the server ``n - 1`` prefills.

:class:`SiblingCalls` gathers first calls by prompt for a while (:data:`GATHER_SHARE`), then
sends each run of consecutive seeds as one ``sample_siblings`` call and any other call
as ``sample_on_route``. Which calls go together depends on timing; the answers do not,
since sample ``i`` of a group is the sample its own seed gives. The agent gathers only
for a policy that answers siblings in one request (:attr:`Policy.groups_siblings`).
:func:`consecutive_runs` is the grouping, a pure function.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence

from focus.policy import Completion, Policy, SamplingParams

Route = tuple[Hashable, ...]

#: How long first calls are gathered before they are sent, as a share of how long this
#: agent's first calls have taken to answer (a running mean), at most
#: :data:`MAX_GATHER_S`; :data:`FIRST_GATHER_S` until one has answered. Slots free one
#: at a time as answers come in, so siblings (taken one after the other,
#: focus.execution) start apart; the longer the wait, the more of them go together, and
#: the wait costs a rollout at most this share of one call. Where the client is the
#: bottleneck its calls wait in it anyway, their time grows with the calls in flight,
#: and so does the gathering. At 10k transitions over 40 tasks (benchmarks/scale.py, one
#: run each, a benchmark running beside) 6,312 first calls went in 3,684 requests with
#: a fixed 1 ms, 3,485 with 5 ms, 2,552 with 20 ms (ideal: 2,565 runs of siblings).
GATHER_SHARE = 0.1
MAX_GATHER_S = 0.02
FIRST_GATHER_S = 0.001


def consecutive_runs(seeds: Sequence[int]) -> list[list[int]]:
    """Indices of ``seeds`` in runs of consecutive values (``s, s + 1, ...``), each run in
    seed order, the runs by their first seed. A repeated seed starts a new run: two calls
    with one seed each get their own request (the same answer, sent twice)."""
    order = sorted(range(len(seeds)), key=lambda i: seeds[i])
    runs: list[list[int]] = []
    for i in order:
        if runs and seeds[i] == seeds[runs[-1][-1]] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


class _Call:
    __slots__ = ("seed", "route", "future")

    def __init__(self, seed: int, route: Route, future: asyncio.Future[Completion]) -> None:
        self.seed, self.route, self.future = seed, route, future


class SiblingCalls:
    """The first calls of one event loop's rollouts, gathered by prompt (see the module
    docs). Made by the agent, one per event loop and policy."""

    def __init__(self, policy: Policy, loop: asyncio.AbstractEventLoop) -> None:
        self.policy, self.loop = policy, loop
        #: Calls gathered for the next send: prompt -> (prompt, params, calls).
        self._open: dict[tuple[int, ...], tuple[Sequence[int], SamplingParams, list[_Call]]] = {}
        #: Requests in flight: kept so that their tasks are not collected.
        self._sending: set[asyncio.Task[None]] = set()
        #: Running mean of the seconds a first call took to answer (None: none yet).
        self.call_s: float | None = None

    @property
    def gather_s(self) -> float:
        """How long the next first calls are gathered (see :data:`GATHER_SHARE`)."""
        if self.call_s is None:
            return FIRST_GATHER_S
        return min(MAX_GATHER_S, GATHER_SHARE * self.call_s)

    def sample(self, prompt_ids: Sequence[int], params: SamplingParams, route: Route) -> asyncio.Future[Completion]:
        """The answer to a rollout's first call (await it). Calls are gathered by prompt:
        the calls of one agent differ only in their seeds otherwise, and any calls with one
        prompt and consecutive seeds may share a request, siblings or not (each gets its
        own seed's sample); by content, not by start state, since a job sent to a Dask
        worker carries its own copy of the state."""
        assert params.seed is not None, "a sibling call is seeded"
        future: asyncio.Future[Completion] = self.loop.create_future()
        if not self._open:
            self.loop.call_later(self.gather_s, self._flush)
        key = prompt_ids if isinstance(prompt_ids, tuple) else tuple(prompt_ids)
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = (prompt_ids, params, [])
        group[2].append(_Call(params.seed, route, future))
        return future

    def _flush(self) -> None:
        groups, self._open = self._open, {}
        for prompt_ids, params, calls in groups.values():
            calls = [c for c in calls if not c.future.done()]  # a caller cancelled already
            for run in consecutive_runs([c.seed for c in calls]):
                members = [calls[i] for i in run]
                self._send(prompt_ids, params.with_seed(members[0].seed), members)

    def _send(self, prompt_ids: Sequence[int], params: SamplingParams, members: list[_Call]) -> None:
        task: asyncio.Task[None] | None = None

        def abandon(_: asyncio.Future[Completion]) -> None:
            # every caller gone (their rollouts cancelled): the request is not needed
            if task is not None and all(m.future.cancelled() for m in members) and not task.done():
                task.cancel()

        task = self.loop.create_task(self._answer(prompt_ids, params, members, abandon))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        for m in members:
            m.future.add_done_callback(abandon)

    async def _answer(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        members: list[_Call],
        abandon: Callable[[asyncio.Future[Completion]], None],
    ) -> None:
        """Send the members' calls as one request and give each caller its answer. A
        caller answered no longer needs ``abandon`` (it finds a caller that is not
        cancelled, at the cost of a callback run by the loop for every first call), so it
        is taken off first."""
        sent = self.loop.time()
        try:
            if len(members) == 1:
                answers = [await self.policy.sample_on_route(prompt_ids, params, members[0].route)]
            else:
                answers = await self.policy.sample_siblings(prompt_ids, params, [m.route for m in members])
            if len(answers) != len(members):
                raise RuntimeError(
                    f"{type(self.policy).__name__}.sample_siblings gave {len(answers)} answers for {len(members)} calls"
                )
        except Exception as e:  # noqa: BLE001 - each caller gets it, as from its own call
            for m in members:
                if not m.future.done():
                    m.future.set_exception(e)
            return
        except BaseException as e:  # cancelled, or the process is stopping: no caller waits forever
            for m in members:  # a CancelledError of the policy's own keeps its message for the callers' cause
                m.future.cancel(str(e) or None if isinstance(e, asyncio.CancelledError) else None)
            raise
        took = self.loop.time() - sent
        self.call_s = took if self.call_s is None else self.call_s + 0.05 * (took - self.call_s)
        for m, answer in zip(members, answers, strict=True):
            if not m.future.done():
                m.future.remove_done_callback(abandon)
                m.future.set_result(answer)
