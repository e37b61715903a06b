"""Running a policy in an env: one rollout from a branch state to a leaf.

:class:`Agent` is the only place where model calls and env steps happen. It records
every model turn token-exactly and, at each decision point that the branch-point rule
allows, a checkpoint: a :class:`BranchState` that search can continue from later,
possibly on another worker. A rollout never raises for a model or env failure: it ends
in a ``failed`` leaf whose cause is kept, and the finished segments before it stay.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import re
import time
import types
from collections.abc import Awaitable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from focus.agent_parts import check_agent_parts, check_colours, check_format
from focus.branching import BranchPoints, BrokenBranchPoints, EveryDecision, eligible
from focus.context import BrokenContextManager, Compaction, Context, ContextManager, Segments, returned
from focus.env import Action, Env, EnvError, Message, Task, accepts_seed, check_reset, check_step_result
from focus.format import ParseError, PolicyFormat
from focus.local_limits import LocalResourceError, local_error
from focus.policy import (
    BadResponse,
    Completion,
    ContextLimit,
    Policy,
    PolicyError,
    SamplingParams,
    ServiceUnavailable,
    UnreadableAnswers,
    check_vocabulary,
)
from focus.reprs import short_repr
from focus.siblings import SiblingCalls
from focus.tree import Turn
from focus.usage import count_retries
from focus.workspace import Workspace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BranchState:
    """Everything needed to continue an episode from a decision point. Picklable.

    ``route``: the path of rollouts that led here - the task id, then the seed of each
    rollout whose segments end at this state - which a policy over several model
    replicas routes calls by (:meth:`focus.policy.Policy.sample_on_route`)."""

    __repr__ = short_repr

    task: Task
    env_state: Any
    workspace: Workspace | None
    context: Context
    steps: int = 0
    transitions: int = 0
    route: tuple[Hashable, ...] = ()

    def fork(self, route: tuple[Hashable, ...] | None = None) -> BranchState:
        """A copy whose workspace is independent of this one's (and whose route is
        ``route``, when given)."""
        workspace = self.workspace.fork() if self.workspace is not None else None
        return self.evolve(workspace=workspace, route=self.route if route is None else route)

    def evolve(self, **changes: Any) -> BranchState:
        """``dataclasses.replace(self, **changes)`` without re-running ``__init__`` field by
        field (the class has no ``__post_init__``): a rollout makes two or three per step."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__, **changes)
        return new


@dataclass(frozen=True)
class Piece:
    """A segment of a rollout and the node it ends in.

    ``kind`` is ``checkpoint`` (``state`` set) or a leaf kind: ``terminal``,
    ``truncated`` or ``failed`` (``cause`` set).
    """

    __repr__ = short_repr

    turns: tuple[Turn, ...]
    kind: str
    steps: int
    context_ids: tuple[int, ...]
    state: BranchState | None = None
    cause: str = ""


@dataclass(frozen=True)
class Rollout:
    """The pieces of one rollout from a start state, in order; the last is the leaf."""

    __repr__ = short_repr

    task_id: str
    pieces: tuple[Piece, ...]
    wall_s: float = 0.0
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def leaf(self) -> Piece:
        return self.pieces[-1]

    @property
    def turns(self) -> list[Turn]:
        return [t for p in self.pieces for t in p.turns]


def derive_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (same parts, same seed, on every machine)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class _StepTimeout(TimeoutError):
    """An env step ran past ``Agent.env_timeout_s`` (not a ``TimeoutError`` of its own)."""


class BrokenParser(TypeError):
    """The action parser returned neither an :class:`~focus.env.Action` nor a
    :class:`~focus.format.ParseError`, or raised (:class:`focus.format.ActionParser`'s
    contract: it never raises)."""


#: The cause of a truncated leaf whose next prompt does not fit the model (the agent's
#: ``max_prompt_tokens``, or the server's context length: :class:`focus.policy.ContextLimit`).
CONTEXT_LIMIT = "context limit"


class Agent:
    """Runs ``policy`` in ``env`` with a context manager and a branch-point rule.

    ``max_steps`` limits rollout steps (model calls, compactions included) from the
    root; a rollout that reaches it ends in a ``truncated`` leaf. ``env_timeout_s``
    bounds one env step; a step that hangs fails the rollout, not the collection.
    """

    def __init__(
        self,
        policy: Policy,
        env: Env,
        format: PolicyFormat,
        *,
        context: ContextManager | None = None,
        branch_points: BranchPoints | None = None,
        max_steps: int = 8,
        sampling: SamplingParams | None = None,
        max_prompt_tokens: int | None = None,
        env_timeout_s: float = 60.0,
    ) -> None:
        if isinstance(max_steps, bool) or not hasattr(max_steps, "__index__"):  # an int, numpy's too
            raise TypeError(f"Agent.max_steps must be an int, got {max_steps!r}")
        if max_steps < 1:
            raise ValueError("Agent.max_steps must be at least 1")
        # 0 or less timed a suspending step out at once, and NaN turned the timeout off
        if not env_timeout_s > 0:
            raise ValueError(f"Agent.env_timeout_s must be a number of seconds > 0, got {env_timeout_s!r}")
        if max_prompt_tokens is not None and max_prompt_tokens < 1:  # 0 failed every rollout
            raise ValueError(f"Agent.max_prompt_tokens must be at least 1 (None: no limit), got {max_prompt_tokens}")
        check_agent_parts(policy=policy, env=env, context=context, branch_points=branch_points, sampling=sampling)
        check_format(format)
        check_colours(policy, format, context, branch_points)
        self.policy = policy
        self.env = env
        self.format = format
        self.context = context or Segments()
        self.branch_points = branch_points or EveryDecision()
        self.max_steps = max_steps
        self.sampling = sampling or SamplingParams()
        codec_stops = tuple(format.codec.stop_token_ids)
        if codec_stops and not set(codec_stops) <= set(self.sampling.stop_token_ids):
            self.sampling = self.sampling.model_copy(
                update={"stop_token_ids": tuple(dict.fromkeys(self.sampling.stop_token_ids + codec_stops))}
            )
        self.max_prompt_tokens = max_prompt_tokens
        self.env_timeout_s = env_timeout_s

    async def start(self, task: Task) -> BranchState:
        """The root branch state of ``task``.

        Runs before any rollout, so a broken env or a codec that does not fit the
        model fails here, naming the task, instead of failing every rollout later.
        """
        where = f"{type(self.env).__name__}.reset"
        timer = asyncio.timeout(self.env_timeout_s)
        try:
            workspace = self.env.make_workspace(task)
            async with timer:
                reset = check_reset(await _awaitable(self.env.reset(task, workspace), where), where)
        except EnvError as e:
            raise EnvError(f"task {task.id!r}: {e}") from e
        except asyncio.CancelledError as e:
            raise EnvError(f"task {task.id!r}: {own_cancel(e, where)}") from e
        except Exception as e:
            if isinstance(e, TimeoutError) and timer.expired():  # not a TimeoutError the env raised itself
                raise EnvError(f"{where} of task {task.id!r} timed out after {self.env_timeout_s:g} s") from None
            raise EnvError(f"{where} of task {task.id!r} failed: {type(e).__name__}: {e}") from e
        try:
            ctx = returned(self.context, "start", self.context.start(self.format.codec, reset.messages), Context)
        except ValueError as e:  # a role the codec has no marker for, say
            raise EnvError(f"the opening messages {where} gave task {task.id!r} do not render: {e}") from e
        try:
            self.policy.check_prompt(ctx.prompt_ids)
        except PolicyError as e:
            raise PolicyError(f"opening context of task {task.id!r}: {e} (does the codec match the model?)") from e
        return BranchState(task, reset.state, workspace, ctx, route=(task.id,))

    async def rollout(self, start: BranchState, seed: int) -> Rollout:
        """Run from ``start`` (which is forked first) to a leaf. Its calls, and the
        checkpoints it records, carry ``start``'s route extended by ``seed``.

        The first model call samples with ``seed`` itself, each later one with
        ``derive_seed(seed, steps)``: rollouts from one start state with consecutive seeds
        make first calls that one request with ``n`` samples answers, and those made
        within a short wait of each other go as one (:mod:`focus.siblings`)."""
        t0 = time.perf_counter()
        state = start.fork(route=(*start.route, seed))
        counters = {"parse_errors": 0, "tool_errors": 0}
        pieces: list[Piece] = []
        turns: list[Turn] = []
        codec = self.format.codec
        fresh = True  # the first model call: sampled with the rollout's own seed (focus.siblings)
        while True:
            if state.steps >= self.max_steps:
                pieces.append(Piece(tuple(turns), "truncated", state.steps, state.context.prompt_ids))
                break
            params, calling = self.sampling.with_seed(seed if fresh else derive_seed(seed, state.steps)), False
            try:
                if turns and eligible(self.branch_points, state):
                    # a frozen state without a workspace is its own checkpoint: this
                    # rollout only replaces it (evolve), so a copy would be the same
                    held = state if state.workspace is None else state.fork()
                    pieces.append(Piece(tuple(turns), "checkpoint", state.steps, state.context.prompt_ids, held))
                    turns = []
                if returned(self.context, "needs_compaction", self.context.needs_compaction(state.context), None):
                    fresh = False
                    c = await self._compact(state.context, params)
                    self._check(c.completion, params)
                    turns.append(_turn(c.prompt_ids, c.completion, c.loss_mask, "compaction", 0.0, False, ""))
                    state = state.evolve(context=c.context, steps=state.steps + 1)
                    continue
                prompt = state.context.prompt_ids
                if self.max_prompt_tokens is not None and len(prompt) > self.max_prompt_tokens:
                    raise ContextLimit(
                        f"the prompt has {len(prompt)} tokens, over max_prompt_tokens {self.max_prompt_tokens}"
                    )
                calling = True  # a NotImplementedError from here on is the policy's, not a custom part's
                completion = await self._call(state.route, prompt, params, fresh)
                fresh = calling = False
                self._check(completion, params)
                if completion.meta:
                    count_retries(counters, completion.meta)
            except (UnreadableAnswers, BrokenContextManager, BrokenBranchPoints, LocalResourceError):
                raise  # a setting or code to fix, not this rollout's failure: stops the collection
            except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001 - a failed model call ends this rollout only
                pieces.append(self._call_failed(e, state, turns, calling))
                break
            text = codec.decode(completion.token_ids)
            action = self._parse(text)
            if isinstance(action, ParseError):
                counters["parse_errors"] += 1
                turns.append(_turn(prompt, completion, 1, "action", 0.0, False, action.message))
                obs, env_state, transitions = [Message("user", action.message)], state.env_state, state.transitions
            else:
                try:
                    step = check_step_result(await self._step(state, action, seed), f"{type(self.env).__name__}.step")
                except Exception as e:  # noqa: BLE001 - env (or parser) code failing ends this rollout only
                    _count_unrecorded(counters, completion)
                    pieces.append(Piece(tuple(turns), "failed", state.steps, prompt, cause=self._step_cause(e)))
                    break
                counters["tool_errors"] += int(step.info.get("tool_error", 0))
                turns.append(_turn(prompt, completion, 1, "action", float(step.reward), True, step.observation))
                if step.done:
                    pieces.append(Piece(tuple(turns), "terminal", state.steps + 1, ()))
                    break
                obs = [Message("tool" if action.kind == "tool" else "user", step.observation)]
                env_state, transitions = step.state, state.transitions + 1
            try:  # the step's state in one copy, its context with it
                ctx = self._extend(state.context, completion, text, obs)
                state = state.evolve(env_state=env_state, steps=state.steps + 1, transitions=transitions, context=ctx)
            except BrokenContextManager:
                raise  # a setting or code to fix: stops the collection
            except Exception as e:  # noqa: BLE001 - an observation the codec cannot render ends this rollout only
                pieces.append(self._unrendered(e, turns, state.steps + 1, prompt, obs[0].role))
                break
        return Rollout(start.task.id, tuple(pieces), time.perf_counter() - t0, counters)

    def _call_failed(self, e: BaseException, state: BranchState, turns: list[Turn], calling: bool) -> Piece:
        """The leaf of a rollout whose model call (or the compaction, context or checkpoint
        before it) raised ``e``: a context over the limit truncates it (a task's own
        prompt over it fails, as refused); anything else fails it (:func:`_call_cause`).
        A ``CancelledError`` the policy raised itself while the rollout was not being
        cancelled fails it as any other exception of a custom policy's own does (``error:
        <Policy>.sample raised CancelledError: ...``), as an env's own fails it (:func:`own_cancel`):
        it stopped the collection as a bare ``CancelledError``, read as an interrupt; one
        that cancels the rollout is raised again. A model call this machine could not make
        (out of open files, local ports or socket memory: a custom policy's own ``OSError``)
        raises :class:`~focus.local_limits.LocalResourceError`: every rollout would meet it."""
        if calling and (local := local_error(e, f" in {type(self.policy).__name__}.sample")) is not None:
            raise local from e
        if isinstance(e, ContextLimit):  # the episode outgrew the context
            kind, cause = ("truncated", CONTEXT_LIMIT) if state.steps else ("failed", f"{failure_prefix(e)}: {e}")
            return Piece(tuple(turns), kind, state.steps, state.context.prompt_ids, cause=cause)
        cause = _call_cause(e, calling)
        if isinstance(e, asyncio.CancelledError):
            own = own_cancel(e, f"{type(self.policy).__name__}.sample")  # raised again if the rollout is cancelled
            cause = f"error: {own}" if calling else cause
        return Piece(tuple(turns), "failed", state.steps, state.context.prompt_ids, cause=cause)

    def _check(self, completion: Completion, params: SamplingParams) -> None:
        """The policy's check of an answer, and the ids against the codec's vocabulary
        where the policy knows none (``OpenAICompatPolicy(url)`` without ``vocab_size``,
        as a library user builds it): an id of another tokenizer was dropped silently by
        ``HFChatCodec.decode`` and went on into the next prompt and the batch, and failed
        ``ByteCodec.decode`` outside the rollout's guard (its job failed, every finished
        segment lost). A :class:`~focus.policy.BadResponse` runs the rollout again, as
        where the policy knows its vocabulary."""
        self.policy.check_completion(completion, params)
        if self.policy.vocab_size is None and isinstance(vocab := getattr(self.format.codec, "vocab_size", None), int):
            check_vocabulary(completion, vocab)

    def _extend(self, ctx: Context, completion: Completion, text: str, obs: Sequence[Message]) -> Context:
        """The context manager's next context, checked (:func:`focus.context.returned`)."""
        return returned(
            self.context, "extend", self.context.extend(ctx, self.format.codec, completion, text, obs), Context
        )

    async def _compact(self, ctx: Context, params: SamplingParams) -> Compaction:
        """The context manager's compaction, checked (:func:`focus.context.returned`)."""
        made = await self.context.compact(ctx, self.format.codec, self.policy, params)
        return returned(self.context, "compact", made, Compaction)

    def _unrendered(self, error: Exception, turns: list[Turn], steps: int, prompt: Sequence[int], role: str) -> Piece:
        """The failed leaf of a rollout whose context could not take the last step's
        observation (a ``tool`` message to a chat template without that role, text a codec
        refuses), after the turns it took: the error ended the rollout's job, whose
        finished turns were lost, and named the step the job started from."""
        where = f"{type(self.context).__name__}.extend ({type(self.format.codec).__name__})"
        what = f"the {role!r} observation of step {steps - 1}"
        cause = f"error: {where} could not add {what}: {error_cause(error).removeprefix('error: ')}"
        return Piece(tuple(turns), "failed", steps, tuple(prompt), cause=cause)

    def _parse(self, text: str) -> Any:
        """The parser's answer to ``text``; a parser that raises (its contract: never), or
        returns neither an Action nor a ParseError, gives the :class:`BrokenParser` its
        rollout fails with, naming it, the rollout's finished segments kept (the exception
        itself failed the job and kept none of them)."""
        try:
            action = self.format.parser.parse(text)
        except Exception as e:  # noqa: BLE001 - the parser's bug ends this rollout only
            name = type(self.format.parser).__name__
            return BrokenParser(f"{name}.parse raised {type(e).__name__}: {e} (return a ParseError instead)")
        return action if isinstance(action, (Action, ParseError)) else BrokenParser(self._parser_returned(action))

    def _parser_returned(self, action: object) -> str:
        name = type(self.format.parser).__name__
        return f"{name}.parse returned {type(action).__name__}, expected an Action or a ParseError"

    def _step_cause(self, e: Exception) -> str:
        """The cause of a rollout whose answer could not be acted on: the env's step
        raised, hung or broke its contract, or the parser returned no action."""
        if isinstance(e, BrokenParser):
            return f"error: {e}"
        if isinstance(e, _StepTimeout):
            return f"env: step timed out after {self.env_timeout_s:g} s"
        if isinstance(e, EnvError):
            return f"env: {e}"
        # the cause is one line; where the env's own code raised, its traceback is what
        # a user debugging the env needs (``-vv``, or a DEBUG handler of their own)
        log.debug("%s.step raised; the rollout ends with it", type(self.env).__name__, exc_info=e)
        return "env" + error_cause(e).removeprefix("error")  # its type alone where its message is empty

    def _call(
        self, route: tuple[Hashable, ...], prompt: Sequence[int], params: SamplingParams, fresh: bool
    ) -> Awaitable[Completion]:
        """A step's model call; a rollout's first one (``fresh``) gathered with its
        siblings' when the policy answers them in one request."""
        if fresh and self.policy.groups_siblings:
            return self._siblings().sample(prompt, params, route)
        return self.policy.sample_on_route(prompt, params, route)

    def _siblings(self) -> SiblingCalls:
        """This event loop's :class:`~focus.siblings.SiblingCalls` (made on first use there)."""
        loop = asyncio.get_running_loop()
        calls = self.__dict__.get("_sibling_calls")
        if calls is None or calls.loop is not loop or calls.policy is not self.policy:
            calls = self.__dict__["_sibling_calls"] = SiblingCalls(self.policy, loop)
        return calls

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_sibling_calls", None)  # bound to this process's event loop
        return state

    async def _step(self, state: BranchState, action: Any, seed: int) -> Any:
        """One env step from ``state``, bounded by ``env_timeout_s`` (``_StepTimeout``).

        The step's coroutine is run by hand up to its first suspension: a step that
        finishes without one (an env computed in Python, as most toy and test envs are)
        needs no timer, and arming ``asyncio.timeout`` costs about 4 us a step (a timer
        handle in the loop's heap, cancelled). A step that suspends finishes under
        ``asyncio.timeout_at`` with the deadline taken before it started, the same
        deadline ``asyncio.timeout`` would have set (no timer can interrupt the
        synchronous part either way). Not ``wait_for``: that wraps every step in a task.
        A ``CancelledError`` of the env's own is its failure (:func:`own_cancel`).
        """
        if isinstance(action, BrokenParser):  # no action to act on: the rollout fails with it
            raise action
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.env_timeout_s
            if self._env_takes_seed():
                seeded: Any = self.env  # step(..., *, seed) is an optional extension
                step: Any = seeded.step(
                    state.env_state, action, state.workspace, seed=derive_seed(seed, state.steps, "env")
                )
            else:
                step = self.env.step(state.env_state, action, state.workspace)
            if type(step) is types.CoroutineType:  # run by hand up to its first suspension
                try:
                    pending = step.send(None)
                except StopIteration as done:
                    return done.value
                step = _resume(step, pending)
            else:
                step = _awaitable(step, f"{type(self.env).__name__}.step")
            timer = asyncio.timeout_at(deadline)  # another awaitable: awaited whole under the timer
            try:
                async with timer:
                    return await step
            except TimeoutError:
                if timer.expired():  # the env's own TimeoutError is its failure, named as raised
                    raise _StepTimeout from None
                raise
        except asyncio.CancelledError as e:
            raise own_cancel(e, f"{type(self.env).__name__}.step") from e

    def _env_takes_seed(self) -> bool:
        """Whether env steps get a seed (see :class:`focus.env.Env`, "Randomness");
        looked up once per env class (the env may be swapped after construction)."""
        cls = type(self.env)
        cache = self.__dict__.get("_seeded")
        if cache is None or cache[0] is not cls:
            cache = self.__dict__["_seeded"] = (cls, accepts_seed(self.env))
        return bool(cache[1])

    async def rollouts(self, starts: Sequence[tuple[BranchState, int]]) -> list[Rollout]:
        """Run several rollouts concurrently (the caller bounds concurrency)."""
        return list(await asyncio.gather(*(self.rollout(s, seed) for s, seed in starts)))


def _awaitable(made: Any, where: str) -> Any:
    """``made``, what an env's ``reset`` or ``step`` returned, if it can be awaited."""
    if not inspect.isawaitable(made):
        raise EnvError(f"{where} returned {type(made).__name__}, not an awaitable: declare it `async def`")
    return made


@types.coroutine
def _resume(coro: Any, pending: Any) -> Any:
    """Await the rest of ``coro``, started by hand, which yielded ``pending``: what
    ``yield from`` does, values sent and exceptions thrown (a cancellation, the
    timeout's included) passed on to it."""
    while True:
        try:
            sent = yield pending
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # noqa: BLE001 - thrown in by the task: the coroutine's to handle
            try:
                pending = coro.throw(e)
            except StopIteration as done:
                return done.value
        else:
            try:
                pending = coro.send(sent)
            except StopIteration as done:
                return done.value


#: How focus.backends.http says its retries ran out (it raises a plain PolicyError).
_RETRIES_EXHAUSTED = re.compile(r"failed after \d+ attempt")


def is_outage(error: BaseException) -> bool:
    """Whether a failed model call means the model service is out (no usable answer
    within the client's retries) rather than that the request or answer was wrong.

    Such failures end the rollout with a cause starting ``model service:``; a wave with
    too many of them fails (:class:`focus.execution.ModelServiceOutage`).
    """
    if isinstance(error, BadResponse):
        return False
    return isinstance(error, ServiceUnavailable) or (
        isinstance(error, PolicyError) and _RETRIES_EXHAUSTED.search(str(error)) is not None
    )


def own_cancel(error: asyncio.CancelledError, where: str) -> EnvError:
    """The :class:`EnvError` of a ``CancelledError`` that env code raised itself (a
    library's cancel scope, a future cancelled elsewhere) while its task was not being
    cancelled; re-raises one that cancels the task (an interrupt, a failed wave). It
    stopped the whole collection as a bare ``CancelledError``, read as an interrupt."""
    task = asyncio.current_task()
    if task is None or task.cancelling():
        raise error
    return EnvError(f"{where} raised CancelledError{f': {error}' if str(error) else ''}")


def failure_prefix(error: BaseException) -> str:
    """The kind a failed model call gives its rollout's cause (:mod:`focus.usage`):
    ``model service`` (an outage), ``bad response`` (an answer that breaks the
    contract) or ``model`` (the request was refused, or the policy failed otherwise)."""
    if is_outage(error):
        return "model service"
    return "bad response" if isinstance(error, BadResponse) else "model"


def _call_cause(error: BaseException, calling: bool) -> str:
    """The cause of a rollout whose model call (or compaction, or the checkpoint before
    it) raised: a :class:`~focus.policy.PolicyError` by its kind (:func:`failure_prefix`),
    and a ``NotImplementedError`` the model call raised (``calling``: a policy without
    the method) as ``model``; anything else (a custom policy's ``ConnectionError``, a bug
    of a context manager, a branch-point rule or a workspace's ``fork``, their
    ``NotImplementedError`` too: it said ``model:`` of them) ``error: ...``, the
    cause of a rollout job that raises (:mod:`focus.execution`). The rollout's finished
    segments stay: the job's failure kept none of them."""
    if isinstance(error, PolicyError) or (calling and isinstance(error, NotImplementedError)):
        return f"{failure_prefix(error)}: {str(error) or type(error).__name__}"
    return error_cause(error)


def error_cause(error: BaseException) -> str:
    """``error: <type>: <message>``, the cause of a rollout a part's exception ended;
    ``error: <type>`` where the message is empty (a bare ``raise NotImplementedError``
    gave ``error: NotImplementedError: ``, and a policy's ``model: `` named nothing)."""
    text = str(error)
    return f"error: {type(error).__name__}: {text}" if text else f"error: {type(error).__name__}"


def _count_unrecorded(counters: dict[str, int], completion: Completion) -> None:
    """Count a model answer that no turn records (its env step failed, or the parser
    returned no action), so the statistics' ``model_calls`` and ``tokens`` are what was
    sent and sampled (:meth:`focus.usage.Usage.of_rollout` adds them)."""
    counters["unrecorded_calls"] = counters.get("unrecorded_calls", 0) + 1
    counters["unrecorded_tokens"] = counters.get("unrecorded_tokens", 0) + len(completion.token_ids)


def _turn(
    prompt: Sequence[int], c: Completion, mask: int, kind: str, reward: float, transition: bool, obs: str
) -> Turn:
    return Turn(
        tuple(prompt),
        tuple(c.token_ids),
        tuple(c.logprobs),
        mask,
        c.finish_reason,
        kind,
        reward,
        transition,
        obs,
        # a custom policy's number, as the policy's own version is read (str()): an int
        # here ran the whole collection and failed at the batch's policy_version column
        None if c.policy_version is None else str(c.policy_version),
    )
