"""Tool-using agents: declare tools, and :class:`ToolEnv` turns them into an Env.

A parsed action is either a tool call (the observation is the tool's result) or a final
answer (judged into a reward, and the episode ends). Tool failures - an exception, a
timeout, a wrong return type, arguments that do not match the schema - become
observations that tell the model what went wrong: the rollout goes on, and the
failure is counted in ``StepResult.info``. A tool's text from bytes that are not UTF-8
(lone surrogates: a file name ``os.listdir`` gives) reaches the model with those bytes
as U+FFFD (:func:`readable`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from focus.env import Action, Env, EnvError, Message, Reset, StepResult, Task
from focus.reprs import short_value
from focus.workspace import Workspace

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list, tuple),
}


@dataclass(frozen=True)
class ToolContext:
    """What a tool call may use: the task, the branch's env state and its workspace."""

    task: Task
    state: Any
    workspace: Workspace | None


ToolFn = Callable[[Mapping[str, Any], ToolContext], Awaitable[str] | str]


@dataclass(frozen=True)
class Tool:
    """A tool declaration: a name, a description, a JSON-schema for its arguments, a call.

    ``fn`` is ``async def fn(args, ctx)`` or a plain ``def``. ``timeout_s`` bounds an
    ``async`` call only: a plain ``def`` runs on the event loop, to its end, whatever
    ``timeout_s`` says, and every rollout of the process waits while it runs (the
    agent's ``env_timeout_s`` cannot fire either). Blocking work (a subprocess, a file
    scan, a socket read) goes in an ``async def`` through ``await asyncio.to_thread(...)``.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFn
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:  # 0 timed a suspending call out at once; NaN turned the timeout off
            raise ValueError(f"Tool {self.name!r}: timeout_s must be a number of seconds > 0, got {self.timeout_s!r}")

    def schema(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}

    def check_arguments(self, args: Mapping[str, Any]) -> str | None:
        """A message naming what is wrong with ``args``, or ``None`` when they fit."""
        if not isinstance(args, Mapping):
            return f"arguments of {self.name} must be a JSON object"
        props = self.parameters.get("properties", {})
        for req in self.parameters.get("required", []):
            if req not in args:
                return f"{self.name} needs the argument {req!r}"
        for key, value in args.items():
            if key not in props:
                if self.parameters.get("additionalProperties", True) is False:
                    return f"{self.name} has no argument {key!r}"
                continue
            want = props[key].get("type")
            types = _JSON_TYPES.get(want) if isinstance(want, str) else None
            if types and (not isinstance(value, types) or (want != "boolean" and isinstance(value, bool))):
                return f"argument {key!r} of {self.name} must be of type {want}"
        return None


def tool(
    name: str, description: str, parameters: Mapping[str, Any], timeout_s: float = 30.0
) -> Callable[[ToolFn], Tool]:
    """Decorator form: ``@tool("search", "...", {...})`` over ``async def fn(args, ctx)``."""

    def wrap(fn: ToolFn) -> Tool:
        return Tool(name, description, parameters, fn, timeout_s)

    return wrap


@dataclass(frozen=True)
class ToolState:
    """The env state of a :class:`ToolEnv` episode: plain data."""

    task: Task
    calls: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)


Judge = Callable[..., float | Awaitable[float]]


def takes_context(judge: Judge) -> bool:
    """Whether ``judge`` takes a third positional argument, the :class:`ToolContext`
    (declared, or ``*args``): then it is called as ``judge(task, answer, ctx)``."""
    try:
        params = list(inspect.signature(judge).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind is p.VAR_POSITIONAL for p in params)


def render_tool_prompt(tools: Sequence[Tool], instructions: str) -> str:
    lines = [instructions, "", "Tools:"]
    lines += [json.dumps(t.schema(), sort_keys=True) for t in tools]
    return "\n".join(lines)


class ToolEnv(Env):
    """An Env from a set of tools and a judge of final answers.

    ``prompt_key`` names the task field holding the question. ``judge(task, answer)``
    returns the final reward; a judge with a third parameter is called as
    ``judge(task, answer, ctx)`` with the branch's :class:`ToolContext`, so a reward can
    read what the episode wrote to its workspace (and may raise: the rollout then ends
    in a failed leaf, as for any env error). ``max_tool_calls`` ends an episode with reward 0 when the
    agent keeps calling tools without answering.
    """

    def __init__(
        self,
        tools: Sequence[Tool],
        judge: Judge,
        *,
        instructions: str = (
            'Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>; '
            "give the final answer as <answer>...</answer>."
        ),
        prompt_key: str = "prompt",
        max_tool_calls: int | None = None,
        workspace_factory: Callable[[Task], Workspace | None] | None = None,
    ) -> None:
        if max_tool_calls is not None and max_tool_calls < 0:
            raise ValueError(f"ToolEnv.max_tool_calls must be >= 0 (None: no limit), got {max_tool_calls}")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.tools = {t.name: t for t in tools}
        self.judge = judge
        self.instructions = instructions
        self.prompt_key = prompt_key
        self.max_tool_calls = max_tool_calls
        self.workspace_factory = workspace_factory

    def make_workspace(self, task: Task) -> Workspace | None:
        return self.workspace_factory(task) if self.workspace_factory else None

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        if self.prompt_key not in task.data:
            raise KeyError(f"task {task.id!r} has no field {self.prompt_key!r}")
        system = render_tool_prompt(list(self.tools.values()), self.instructions)
        return Reset(ToolState(task), (Message("system", system), Message("user", str(task.data[self.prompt_key]))))

    async def step(self, state: ToolState, action: Action, workspace: Workspace | None) -> StepResult:
        if action.kind == "answer":
            if takes_context(self.judge):
                reward = self.judge(state.task, action.text, ToolContext(state.task, state, workspace))
            else:
                reward = self.judge(state.task, action.text)
            if inspect.isawaitable(reward):
                reward = await reward
            try:  # what float() reads, as an env's reward (numpy's and torch's numbers too)
                value = float(reward)
            except (TypeError, ValueError):  # None (a forgotten return) failed naming no judge
                raise EnvError(
                    f"the judge of {type(self).__name__} returned {short_value(reward)} for task {state.task.id!r}, "
                    "expected a number (the reward)"
                ) from None
            return StepResult(state, "", value, True)
        if action.kind != "tool":
            return StepResult(state, "Call a tool or give a final answer.", 0.0, False, {"invalid_action": 1})
        new_state = replace(state, calls=state.calls + 1)
        observation, info = await self._call(action, new_state, workspace)
        done = self.max_tool_calls is not None and new_state.calls >= self.max_tool_calls
        return StepResult(new_state, observation, 0.0, done, info)

    async def _call(self, action: Action, state: ToolState, workspace: Workspace | None) -> tuple[str, dict[str, int]]:
        t = self.tools.get(action.name)
        if t is None:
            return f"Unknown tool {action.name!r}; available: {', '.join(sorted(self.tools))}.", {"tool_error": 1}
        problem = t.check_arguments(action.arguments)
        if problem:
            return f"Invalid arguments: {problem}.", {"tool_error": 1}
        ctx = ToolContext(state.task, state, workspace)
        timer = asyncio.timeout(t.timeout_s)
        try:
            out = t.fn(action.arguments, ctx)
            if inspect.isawaitable(out):
                async with timer:
                    out = await out
        except Exception as e:  # noqa: BLE001 - a tool failure is the model's observation
            if isinstance(e, TimeoutError) and timer.expired():  # not the tool's own TimeoutError
                return f"Tool {t.name} timed out after {t.timeout_s:g} s.", {"tool_error": 1, "tool_timeout": 1}
            return f"Tool {t.name} failed: {type(e).__name__}: {e}", {"tool_error": 1}
        if not isinstance(out, str):
            return f"Tool {t.name} returned {type(out).__name__}, not text.", {"tool_error": 1}
        return readable(out), {}


def readable(text: str) -> str:
    """``text`` with the lone surrogates replaced by U+FFFD, as a terminal shows bytes it
    cannot decode. A tool that lists files or reads a process's output has text from
    bytes that are not UTF-8 (``os.listdir``, ``os.fsdecode``, ``errors="surrogateescape"``);
    no codec encodes it, and the observation was refused, failing the rollout
    (:func:`focus.env.check_step_result`), where all of the output but those bytes reads."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    try:
        raw = text.encode("utf-8", "surrogateescape")  # an escaped byte (U+DC80-U+DCFF) back to that byte
    except UnicodeEncodeError:  # another surrogate: its three bytes, none of them UTF-8
        raw = text.encode("utf-8", "surrogatepass")
    return raw.decode("utf-8", "replace")
