"""The parts an :class:`~focus.agent.Agent` is given, checked when it is built.

A part of the wrong role or colour (a class for an instance, an ``async def`` where the
agent uses the answer at once, a codec alone where a codec and a parser are needed)
failed in the first rollout, with a message about something else; these checks name it.
"""

from __future__ import annotations

import inspect
from typing import Any

from focus.branching import BranchPoints
from focus.context import ContextManager
from focus.env import Env
from focus.format import ActionParser, ChatCodec, PolicyFormat
from focus.policy import Policy, SamplingParams


def check_agent_parts(**parts: Any) -> None:
    """Each part given to an :class:`Agent` (``None``: its default) is an instance of its
    interface, or a :class:`TypeError` names it: a class or another role's part was taken
    and failed in the first rollout, or with an ``AttributeError`` about something else."""
    roles: dict[str, type] = {"policy": Policy, "env": Env, "context": ContextManager}
    roles |= {"branch_points": BranchPoints, "sampling": SamplingParams}
    for name, value in parts.items():
        interface = roles[name]
        if value is None and name not in ("policy", "env") or isinstance(value, interface):
            continue
        what = f"the class {value.__name__}" if isinstance(value, type) else f"a {type(value).__name__}"
        hint = " (call it: an instance is a part)" if isinstance(value, type) and issubclass(value, interface) else ""
        raise TypeError(f"Agent's {name} must be an instance of {interface.__name__}, got {what}{hint}")


def check_colours(
    policy: Policy, format: PolicyFormat, context: ContextManager | None, rule: BranchPoints | None
) -> None:
    """``Policy.sample`` is ``async def``; ``BranchPoints.eligible``, ``ContextManager.extend``
    and ``ActionParser.parse`` are not. An async ``eligible`` returns a coroutine, which is
    true, so every decision point became a checkpoint (with a "never awaited" warning); an
    async ``extend`` failed every rollout with "'coroutine' object has no attribute
    'prompt_ids'"; a plain ``sample`` with "object Completion can't be used in 'await'
    expression"."""
    for part, method in ((rule, "eligible"), (context, "extend"), (format.parser, "parse")):
        if part is not None and inspect.iscoroutinefunction(inspect.unwrap(getattr(type(part), method))):
            raise TypeError(
                f"{type(part).__name__}.{method} is `async def`: declare it `def` (its answer is used at once)"
            )
    sample = inspect.unwrap(type(policy).sample)
    if inspect.isfunction(sample) and not inspect.iscoroutinefunction(sample):
        raise TypeError(f"{type(policy).__name__}.sample is not `async def`: declare it `async def`")


def check_format(format: object) -> None:
    """``format`` is a :class:`PolicyFormat`; a codec or a parser alone is named."""
    if isinstance(format, PolicyFormat):
        return
    hint = ""
    if isinstance(format, ChatCodec):
        hint = " (pair the codec with a parser: PolicyFormat(codec, parser))"
    elif isinstance(format, ActionParser):
        hint = " (pair it with a codec: PolicyFormat(codec, parser))"
    raise TypeError(f"Agent's format must be a PolicyFormat, got a {type(format).__name__}{hint}")
