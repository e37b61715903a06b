"""Evaluating the embedded tiny model on held-out tasks (the local trainer's loop and benchmarks).

Held apart from :mod:`focus.train_local` (which re-exports these names) so that the
trainer stays one concern: an evaluation needs a model server, not torch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from focus.sums import left_sum

if TYPE_CHECKING:
    from focus.agent import Agent
    from focus.env import Task


@dataclass(frozen=True)
class Evaluation:
    """One plain rollout per held-out task: share solved (return > 0) and mean return.

    ``outcomes``: "1" (solved) or "0" per task, in the tasks' order (paired comparisons
    of two policies on the same tasks); ``invalid_turns``: turns whose reply the format
    could not parse (no action).
    """

    episodes: int
    success_rate: float
    mean_return: float
    transitions: int
    outcomes: str = ""
    invalid_turns: int = 0


async def evaluate(agent: Agent, tasks: Sequence[Task], seed: int, max_concurrency: int = 32) -> Evaluation:
    """Run one rollout per task with fixed per-task seeds (the same every call, so
    evaluations of different weights differ by the weights, not by the dice)."""
    from focus.agent import derive_seed

    if not tasks:
        raise ValueError("evaluate needs at least one task")
    sem = asyncio.Semaphore(max_concurrency)

    async def one(i: int, task: Task) -> tuple[float, int, int]:
        async with sem:
            rollout = await agent.rollout(await agent.start(task), derive_seed("eval", seed, i))
        return left_sum(t.reward for t in rollout.turns), len(rollout.turns), rollout.counters.get("parse_errors", 0)

    results = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    n = len(results)
    return Evaluation(
        n,
        sum(1 for r, _, _ in results if r > 0) / n,
        left_sum(r for r, _, _ in results) / n,
        sum(k for _, k, _ in results),
        "".join("1" if r > 0 else "0" for r, _, _ in results),
        sum(e for _, _, e in results),
    )


def toy_agent(url: str, max_steps: int = 12, temperature: float = 1.0) -> Agent:
    """An agent for the toy task on an OpenAI-compatible server of the embedded model."""
    from focus.agent import Agent
    from focus.backends import OpenAICompatPolicy
    from focus.format import ByteCodec
    from focus.policy import SamplingParams
    from focus.toy import ReachTarget, toy_format

    policy = OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size)
    return Agent(
        policy,
        ReachTarget(),
        toy_format(),
        max_steps=max_steps,
        sampling=SamplingParams(max_tokens=4, temperature=temperature),
    )
