"""A toy task the embedded tiny model can learn: reach a target total exactly.

The task gives a target T; each turn the model says one digit 1-9, which is added to a
running total shown back as the observation; the episode ends when the total reaches
or passes T, with reward 1 only for landing exactly on T. It is multi-step on purpose:
whether a state can still succeed depends on the remaining distance, so values differ
between checkpoints, branching from a promising state pays off and a critic has
something to learn. A policy choosing digits uniformly at random succeeds about one
time in five, which leaves room for RL to improve it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from focus.env import Action, Env, Message, Reset, StepResult, Task
from focus.format import ActionParser, ByteCodec, ParseError, PolicyFormat
from focus.sums import left_sum
from focus.workspace import Workspace

MIN_TARGET, MAX_TARGET = 5, 15


@dataclass(frozen=True)
class ReachState:
    target: int
    total: int = 0
    turns: int = 0


def opening_text(target: int) -> str:
    return f"Reach {target}. Total 0."


def observation_text(total: int) -> str:
    return f"Total {total}."


class ReachTarget(Env):
    """Each action adds a digit 1-9 to the total; done when total >= target.

    ``max_turns`` ends an episode early with reward 0 (a guard for policies that keep
    producing valid but useless moves; with digits >= 1 it is never needed for targets
    up to ``max_turns``).
    """

    def __init__(self, max_turns: int = 32) -> None:
        self.max_turns = max_turns

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        target = task.data.get("target")
        if not isinstance(target, int) or isinstance(target, bool) or target < 1:
            raise ValueError(f"task {task.id!r} needs an integer 'target' >= 1, got {target!r}")
        return Reset(ReachState(target), (Message("user", opening_text(target)),))

    async def step(self, state: ReachState, action: Action, workspace: Workspace | None) -> StepResult:
        digit = _digit(action.text) if action.kind in ("text", "answer") else None
        if digit is None:
            return StepResult(state, "Say one digit 1-9.", 0.0, False, {"invalid_action": 1})
        new = ReachState(state.target, state.total + digit, state.turns + 1)  # replace()'s fields, at half its cost
        if new.total >= new.target:
            return StepResult(new, observation_text(new.total), 1.0 if new.total == new.target else 0.0, True)
        return StepResult(new, observation_text(new.total), 0.0, new.turns >= self.max_turns)


_DIGIT = re.compile(r"[1-9]")


def _digit(text: str) -> int | None:
    m = _DIGIT.search(text)
    return int(m.group()) if m else None


class FirstDigitParser(ActionParser):
    """The first digit 1-9 in the response is the move; none is a parse error."""

    def parse(self, text: str) -> Action | ParseError:
        d = _digit(text)
        if d is None:
            return ParseError("Say one digit 1-9.")
        return Action("text", text=str(d))


def toy_format() -> PolicyFormat:
    """The byte codec of the tiny model with the first-digit parser."""
    return PolicyFormat(ByteCodec(), FirstDigitParser())


def reach_target_tasks(n: int, seed: int = 0, *, low: int = MIN_TARGET, high: int = MAX_TARGET) -> list[Task]:
    """``n`` tasks with targets drawn uniformly from [low, high]; same seed, same tasks."""
    if n < 0 or not 1 <= low <= high:
        raise ValueError(f"need n >= 0 and 1 <= low <= high, got n={n}, low={low}, high={high}")
    rng = random.Random(seed)
    return [Task(f"reach-{seed}-{i}", {"target": rng.randint(low, high)}) for i in range(n)]


def success_probability_uniform(target: int) -> float:
    """Exact success probability of uniformly random digits for ``target`` (a baseline)."""
    p = [0.0] * (target + 1)
    p[0] = 1.0
    for t in range(1, target + 1):
        p[t] = left_sum(p[t - d] for d in range(1, 10) if t - d >= 0) / 9
    return p[target]
