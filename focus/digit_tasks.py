"""Digit tasks with different structure, for the learning benchmark.

The embedded tiny model answers the toy task (:mod:`focus.toy`) with one digit per
turn; these tasks keep that action space (one digit 1-9, the first digit of the reply
counts) and vary what a branching search can exploit:

``Corridor``   walk ``length`` steps; at one step, the *gate*, only a low digit (1-3)
               passes. The reward (1 or 0) comes at the end of the walk either way, so
               with the gate at step 1 (``early``) the decision precedes every later
               checkpoint, and with the gate at the last step (``late``) every earlier
               checkpoint shares its value and only the last one decides.
``Bridge``     cross ``length`` planks; a digit 8 or 9 breaks the plank and ends the
               episode at once with reward 0; reward 1 for reaching the far side. A
               failure ends an episode mid-way.
long reach     the toy's "reach a target total" with targets 20-35: about six turns an
               episode instead of two (a longer horizon, same rule).

A policy choosing digits uniformly at random succeeds about a third of the time in a
corridor, ``(7/9)^length`` on a bridge (0.28 at 5 planks) and about a fifth of the
time on a long reach, which leaves room for RL in every one.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from focus.env import Action, Env, Message, Reset, StepResult, Task
from focus.toy import _digit
from focus.workspace import Workspace

#: Digits that pass a corridor's gate.
GATE_DIGITS = frozenset({1, 2, 3})
#: Digits that break a bridge's plank.
BREAKING_DIGITS = frozenset({8, 9})
INVALID = "Say one digit 1-9."


@dataclass(frozen=True)
class WalkState:
    length: int
    gate: int = 0  # corridor only: the 1-based step whose digit decides
    step: int = 0  # steps taken
    passed: bool = True


def _int_field(task: Task, key: str, low: int) -> int:
    v = task.data.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ValueError(f"task {task.id!r} needs an integer {key!r} >= {low}, got {v!r}")
    return v


class Corridor(Env):
    """``length`` steps; the digit said at step ``gate`` must be 1-3 (reward at the end)."""

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        length = _int_field(task, "length", 1)
        gate = _int_field(task, "gate", 1)
        if gate > length:
            raise ValueError(f"task {task.id!r}: gate {gate} is past the corridor's {length} steps")
        return Reset(WalkState(length, gate), (Message("user", f"Corridor of {length}. Step 1."),))

    async def step(self, state: WalkState, action: Action, workspace: Workspace | None) -> StepResult:
        digit = _digit(action.text) if action.kind in ("text", "answer") else None
        if digit is None:
            return StepResult(state, INVALID, 0.0, False, {"invalid_action": 1})
        step = state.step + 1
        passed = state.passed and (step != state.gate or digit in GATE_DIGITS)
        new = replace(state, step=step, passed=passed)
        if step >= state.length:
            return StepResult(new, "End.", 1.0 if passed else 0.0, True)
        return StepResult(new, f"Step {step + 1}.", 0.0, False)


class Bridge(Env):
    """``length`` planks; 8 or 9 breaks one (episode over, reward 0); reward 1 at the end."""

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        length = _int_field(task, "length", 1)
        return Reset(WalkState(length), (Message("user", f"Bridge of {length}. Plank 1."),))

    async def step(self, state: WalkState, action: Action, workspace: Workspace | None) -> StepResult:
        digit = _digit(action.text) if action.kind in ("text", "answer") else None
        if digit is None:
            return StepResult(state, INVALID, 0.0, False, {"invalid_action": 1})
        new = replace(state, step=state.step + 1)
        if digit in BREAKING_DIGITS:
            return StepResult(replace(new, passed=False), "Fell.", 0.0, True)
        if new.step >= state.length:
            return StepResult(new, "Across.", 1.0, True)
        return StepResult(new, f"Plank {new.step + 1}.", 0.0, False)


def corridor_tasks(n: int, seed: int = 0, *, gate: str = "late", lengths: tuple[int, int] = (3, 5)) -> list[Task]:
    """``n`` corridors of random length in ``lengths``; the gate at step 1 (``early``)
    or at the last step (``late``). Same seed, same tasks."""
    if gate not in ("early", "late"):
        raise ValueError(f"gate must be 'early' or 'late', got {gate!r}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(*lengths)
        out.append(Task(f"corridor-{gate}-{seed}-{i}", {"length": length, "gate": 1 if gate == "early" else length}))
    return out


def bridge_tasks(n: int, seed: int = 0, *, lengths: tuple[int, int] = (4, 6)) -> list[Task]:
    """``n`` bridges of random length in ``lengths``. Same seed, same tasks."""
    rng = random.Random(seed)
    return [Task(f"bridge-{seed}-{i}", {"length": rng.randint(*lengths)}) for i in range(n)]


def long_reach_tasks(n: int, seed: int = 0) -> list[Task]:
    """The toy's task with targets 20-35 (``focus.toy.ReachTarget``)."""
    from focus.toy import reach_target_tasks

    return [replace(t, id=t.id.replace("reach", "reach-long")) for t in reach_target_tasks(n, seed, low=20, high=35)]
