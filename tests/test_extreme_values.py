"""Rewards and critic values at the edges of what a double holds, on small in-test MDPs.

A NaN or infinite reward, or one whose fourth power overflows the noise fit, fails the
rollout that received it (its cause names the reward); a critic value past the same
limit is a CriticError naming the state; rewards near 1e-90, whose variances' squares
underflow to 0, are collected like any others (docs/algorithm.md, "Truncation").
"""

from __future__ import annotations

import math

import pytest

from focus.agent import Agent
from focus.collector import Collector
from focus.critic import ConstantCritic, CriticError
from focus.env import VALUE_LIMIT, Task
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.priority import Phase, Selective, Uniform
from focus.synthetic import SyntheticCritic, SyntheticEnv, SyntheticPolicy, Transition, TreeMDP, build, synthetic_format
from focus.testing import run

PHASES = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=60))


def walk(scale: float = 1.0, odd: float | None = None) -> TreeMDP:
    """Four steps of two actions (move 0 or +1); the last step pays ``scale`` times the
    position reached, and ``odd`` (if given) is paid instead on reaching position 1 at step 3."""

    def actions(key: tuple[int, int]) -> list[Transition]:
        t, x = key
        if t == 4:
            return []
        out: list[Transition] = []
        for a in (0, 1):
            r = scale * (x + a) if t == 3 else 0.0
            if odd is not None and t == 2 and x + a == 1:
                r = odd
            out.append(((t + 1, x + a), r, 0.5, 2 + a))
        return out

    return build((0, 0), actions)


def collector(mdps: list[TreeMDP], critic, search) -> tuple[Collector, list[Task]]:
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=6)
    col = Collector(agent, search, critic, DirectBranchTd(), Execution(max_concurrency=8), seed=1)
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(len(mdps))]


@pytest.mark.parametrize("reward", [math.nan, math.inf, 1e78])
def test_a_reward_that_is_not_finite_or_past_the_limit_fails_its_rollout(reward: float) -> None:
    """Before, a NaN reward ran the whole collection and the batch was refused with the
    estimator blamed for a NaN advantage; 1e78 raised OverflowError inside the noise fit."""
    col, tasks = collector([walk(odd=reward), walk()], ConstantCritic(0.5), Selective(phases=PHASES))
    batch = run(col.collect(tasks))
    assert batch.stats["failed_env"] > 0
    assert any("reward" in c and f"{reward!r}" in c for c in batch.stats["failure_causes"])
    assert batch.actor and all(math.isfinite(r.advantage) for r in batch.actor)
    assert all(math.isfinite(c.target) for c in batch.critic)


def test_a_critic_value_past_the_limit_is_named_by_its_state() -> None:
    """Before: OverflowError in the noise fit (a fourth power of 1e78)."""

    class Huge(SyntheticCritic):
        def value(self, task: int, s: int) -> float:
            return 1e78 if task == 1 and s > 0 else super().value(task, s)

    mdps = [walk(), walk()]
    col, tasks = collector(mdps, Huge(mdps), Selective(phases=PHASES))
    limit = f"{VALUE_LIMIT:g}".replace("+", r"\+")
    where = rf"critic Huge returned the value 1e\+78 beyond ±{limit} at position \d+ \(checkpoint node \d+ at depth [1-3] of tree t1#1\)"
    with pytest.raises(CriticError, match=where):
        run(col.collect(tasks))


@pytest.mark.parametrize("search", [Selective(phases=PHASES), Uniform(phases=PHASES)], ids=["selective", "uniform"])
def test_rewards_near_1e_minus_90_are_collected(search) -> None:
    """Variances near 1e-180 square to 0: ``v²/(t + v)²`` divided by zero in the ranking's
    spread factor and in the noise fit's only-child weight (ZeroDivisionError before)."""
    mdps = [walk(1e-90), walk(2e-90), walk(3e-90)]
    col, tasks = collector(mdps, SyntheticCritic(mdps), search)
    batch = run(col.collect(tasks))
    assert batch.stats["failed_rollouts"] == 0
    assert batch.actor and all(math.isfinite(r.advantage) for r in batch.actor)
    assert max(abs(r.advantage) for r in batch.actor) > 0
