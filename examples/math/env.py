"""The MATH environment: a question, a final answer, a verifier's reward.

The episode is one question. The parser (``FinalAnswerParser``) extracts the final
answer from the model's reply; the env judges it with
:func:`examples.math.verifier.answers_equivalent`. With ``max_attempts > 1`` a wrong
answer is shown back ("not correct, try again") and the episode goes on, which gives
the search decision points to branch from; the reward is 1 for the first correct
answer and 0 when the attempts run out.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

from examples.math.problems import DIFFICULTIES, Problem, generate_problems
from examples.math.verifier import answers_equivalent
from focus.env import Action, Env, Message, Reset, StepResult, Task
from focus.format import PolicyFormat
from focus.workspace import Workspace

INSTRUCTIONS = "Solve the problem. Finish your reply with 'Answer: <value>'."


@dataclass(frozen=True)
class MathState:
    answer: str
    attempts: int = 0


def math_tasks(problems: list[Problem]) -> list[Task]:
    """Tasks for the Agent from a problem set."""
    return [Task(p.id, {"question": p.question, "answer": p.answer, "kind": p.kind}) for p in problems]


def default_tasks(n: int = 20, seed: int = 0, difficulty: str = "standard") -> list[Task]:
    """``n`` generated problems of a difficulty in ``problems.DIFFICULTIES``."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown difficulty {difficulty!r}; known: {sorted(DIFFICULTIES)}")
    return math_tasks(generate_problems(n, seed, DIFFICULTIES[difficulty]))


class MathEnv(Env):
    def __init__(self, max_attempts: int = 1, instructions: str = INSTRUCTIONS) -> None:
        if max_attempts < 1:
            raise ValueError("MathEnv.max_attempts must be at least 1")
        self.max_attempts = max_attempts
        self.instructions = instructions

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        for key in ("question", "answer"):
            if not isinstance(task.data.get(key), str) or not task.data[key]:
                raise ValueError(f"math task {task.id!r} needs a non-empty string {key!r}")
        messages = (Message("system", self.instructions), Message("user", str(task.data["question"])))
        return Reset(MathState(str(task.data["answer"])), messages)

    async def step(self, state: MathState, action: Action, workspace: Workspace | None) -> StepResult:
        if action.kind not in ("answer", "text"):
            return StepResult(state, "Give a final answer as 'Answer: <value>'.", 0.0, False, {"invalid_action": 1})
        new = replace(state, attempts=state.attempts + 1)
        # sympy work off the event loop: other rollouts keep waiting on the model meanwhile
        correct = await asyncio.to_thread(answers_equivalent, action.text, state.answer)
        if correct:
            return StepResult(new, "Correct.", 1.0, True, {"correct": 1})
        if new.attempts >= self.max_attempts:
            return StepResult(new, "Not correct.", 0.0, True)
        return StepResult(new, "Not correct. Try again.", 0.0, False)


def env_factory(
    n_tasks: int, seed: int, *, difficulty: str = "standard", max_attempts: int = 2, tokenizer: str | None = None
) -> tuple[MathEnv, PolicyFormat, list[Task]]:
    """The ``env.factory`` of ``focus collect`` for this env: ``(env, format, tasks)``.

    ``focus collect --set env.kind=factory --set env.factory=examples.math.env:env_factory``;
    ``env.options`` are the keyword arguments (``--set env.options.difficulty=digit_sum``).
    ``tokenizer``: a local ``tokenizer.json`` for a real model's ChatML, else the
    embedded tiny model's byte codec.
    """
    from focus.format import ByteCodec, ChatCodec, FinalAnswerParser

    codec: ChatCodec = ByteCodec()
    if tokenizer:
        from focus.hf_codec import HFChatCodec

        codec = HFChatCodec(tokenizer)
    fmt = PolicyFormat(codec, FinalAnswerParser(require_marker=False))
    return MathEnv(max_attempts=max_attempts), fmt, default_tasks(n_tasks, seed, difficulty)
