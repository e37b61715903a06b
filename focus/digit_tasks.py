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

A corridor or bridge task with ``ranges`` (one ``[low, high]`` per step, drawn from the
task set's seed) is *cued*: each step's observation names a digit range. A cued corridor's
gate passes a digit in the range named there ("Step 2: 4-6."), instead of 1-3; a cued
bridge's plank breaks on a digit in the range named there ("Plank 2: not 4."), as well as
on 8 and 9. Without ranges the right action is one constant rule (say 1-3 at the gate,
never 8 or 9), which a few successes teach as well as many; with them it depends on the
observation, as in real agent tasks, and the policy must learn a mapping on top of a
constant part (a corridor's gate never passes 7-9 in the record's cued corridors, 8 and 9
always break a plank) (docs/findings/learning-steps.md, "Cued tasks"). Steps other than a
corridor's gate name a range too, which nothing checks.

A policy choosing digits uniformly at random succeeds about a third of the time in a
corridor, ``(7/9)^length`` on a bridge (0.28 at 5 planks) and about a fifth of the
time on a long reach, which leaves room for RL in every one; in the record's cued
corridors (1-3 or 4-6 named) a third of the time, on its cued bridge (one digit 1-7
named) ``(2/3)^length``.
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
    ranges: tuple[tuple[int, int], ...] = ()  # cued: the digit range named at each step


def _ranges(task: Task, length: int) -> tuple[tuple[int, int], ...]:
    """The task's per-step digit ranges (empty: not cued), checked: one [low, high] with
    1 <= low <= high <= 9 per step."""
    raw = task.data.get("ranges")
    if raw is None:
        return ()
    ok = isinstance(raw, (list, tuple)) and len(raw) == length
    out = (
        tuple((r[0], r[1]) for r in raw)
        if ok and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in raw)
        else ()
    )
    if not out or not all(isinstance(v, int) and not isinstance(v, bool) for r in out for v in r):
        raise ValueError(f"task {task.id!r}: 'ranges' must hold one [low, high] per step ({length}), got {raw!r}")
    if not all(1 <= lo <= hi <= 9 for lo, hi in out):
        raise ValueError(f"task {task.id!r}: every range needs 1 <= low <= high <= 9, got {raw!r}")
    return out


def _cue(state: WalkState, step: int, prefix: str = "") -> str:
    """What the observation of 1-based ``step`` adds: the range named there, if cued."""
    if not state.ranges:
        return "."
    lo, hi = state.ranges[step - 1]
    return f": {prefix}{lo}." if lo == hi else f": {prefix}{lo}-{hi}."


def _in_range(state: WalkState, step: int, digit: int) -> bool:
    lo, hi = state.ranges[step - 1]
    return lo <= digit <= hi


def _int_field(task: Task, key: str, low: int) -> int:
    v = task.data.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ValueError(f"task {task.id!r} needs an integer {key!r} >= {low}, got {v!r}")
    return v


class Corridor(Env):
    """``length`` steps; the digit said at step ``gate`` must be 1-3, or in the range
    named there if the task is cued (reward at the end)."""

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        length = _int_field(task, "length", 1)
        gate = _int_field(task, "gate", 1)
        if gate > length:
            raise ValueError(f"task {task.id!r}: gate {gate} is past the corridor's {length} steps")
        state = WalkState(length, gate, ranges=_ranges(task, length))
        return Reset(state, (Message("user", f"Corridor of {length}. Step 1{_cue(state, 1)}"),))

    async def step(self, state: WalkState, action: Action, workspace: Workspace | None) -> StepResult:
        digit = _digit(action.text) if action.kind in ("text", "answer") else None
        if digit is None:
            return StepResult(state, INVALID, 0.0, False, {"invalid_action": 1})
        step = state.step + 1
        good = _in_range(state, step, digit) if state.ranges else digit in GATE_DIGITS
        passed = state.passed and (step != state.gate or good)
        new = replace(state, step=step, passed=passed)
        if step >= state.length:
            return StepResult(new, "End.", 1.0 if passed else 0.0, True)
        return StepResult(new, f"Step {step + 1}{_cue(state, step + 1)}", 0.0, False)


class Bridge(Env):
    """``length`` planks; 8 or 9 breaks one, and if the task is cued so does a digit in
    the range named at that plank (episode over, reward 0); reward 1 at the end."""

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        length = _int_field(task, "length", 1)
        state = WalkState(length, ranges=_ranges(task, length))
        return Reset(state, (Message("user", f"Bridge of {length}. Plank 1{_cue(state, 1, 'not ')}"),))

    async def step(self, state: WalkState, action: Action, workspace: Workspace | None) -> StepResult:
        digit = _digit(action.text) if action.kind in ("text", "answer") else None
        if digit is None:
            return StepResult(state, INVALID, 0.0, False, {"invalid_action": 1})
        new = replace(state, step=state.step + 1)
        if digit in BREAKING_DIGITS or (bool(state.ranges) and _in_range(state, new.step, digit)):
            return StepResult(replace(new, passed=False), "Fell.", 0.0, True)
        if new.step >= state.length:
            return StepResult(new, "Across.", 1.0, True)
        return StepResult(new, f"Plank {new.step + 1}{_cue(state, new.step + 1, 'not ')}", 0.0, False)


def _draw_ranges(rng: random.Random, length: int, width: int, blocks: int) -> list[list[int]]:
    """One range per step, uniform over the first ``blocks`` blocks of ``width`` digits
    from 1 (width 3, blocks 2: 1-3 or 4-6): disjoint, so no digit is in every range."""
    lows = [1 + k * width for k in range(blocks)]
    return [[lo, lo + width - 1] for lo in (rng.choice(lows) for _ in range(length))]


def _check_cue(width: int | None, blocks: int) -> None:
    if width is not None and not (width >= 1 and blocks >= 2 and width * blocks <= 9):
        raise ValueError(
            f"a cue needs width >= 1 and 2 or more blocks within 1-9, got width {width!r}, blocks {blocks}"
        )


def corridor_tasks(
    n: int,
    seed: int = 0,
    *,
    gate: str = "late",
    lengths: tuple[int, int] = (3, 5),
    width: int | None = None,
    blocks: int = 2,
) -> list[Task]:
    """``n`` corridors of random length in ``lengths``; the gate at step 1 (``early``)
    or at the last step (``late``). ``width``: cued, each step names one of the first
    ``blocks`` ranges of that many digits, and the gate passes a digit in the range it
    names (None: the constant rule, 1-3 at the gate). Same seed, same tasks."""
    if gate not in ("early", "late"):
        raise ValueError(f"gate must be 'early' or 'late', got {gate!r}")
    _check_cue(width, blocks)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(*lengths)
        data: dict[str, object] = {"length": length, "gate": 1 if gate == "early" else length}
        if width is not None:
            data["ranges"] = _draw_ranges(rng, length, width, blocks)
        out.append(
            Task(f"corridor-{gate}-{seed}-{i}" if width is None else f"corridor-{gate}-w{width}-{seed}-{i}", data)
        )
    return out


def bridge_tasks(
    n: int, seed: int = 0, *, lengths: tuple[int, int] = (4, 6), width: int | None = None, blocks: int = 7
) -> list[Task]:
    """``n`` bridges of random length in ``lengths``; 8 and 9 break a plank. ``width``:
    cued, each plank also names one of the first ``blocks`` ranges of that many digits,
    which breaks it too (width 1, blocks 7: one digit 1-7). Same seed, same tasks."""
    _check_cue(width, blocks)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(*lengths)
        if width is None:
            out.append(Task(f"bridge-{seed}-{i}", {"length": length}))
        else:
            out.append(
                Task(
                    f"bridge-w{width}-{seed}-{i}",
                    {"length": length, "ranges": _draw_ranges(rng, length, width, blocks)},
                )
            )
    return out


def long_reach_tasks(n: int, seed: int = 0) -> list[Task]:
    """The toy's task with targets 20-35 (``focus.toy.ReachTarget``)."""
    from focus.toy import reach_target_tasks

    return [replace(t, id=t.id.replace("reach", "reach-long")) for t in reach_target_tasks(n, seed, low=20, high=35)]
