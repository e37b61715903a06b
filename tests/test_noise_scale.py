"""The noise fit and the batch do not depend on the unit rewards are counted in.

Rewards in points, in dollars or in thousandths describe the same task; a search and an
estimator that change their answer with the unit are tuned to one. Found by running the
estimator benchmark's families with every reward times 1000, 7.3 and 1/1000: with an
exact critic the fit hung on rounding (siblings that should agree differed by 1e-17, or
did not), and on critical/2H the batch's advantages moved by 0.44 with the unit.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from focus.agent import Agent
from focus.collector import Collector
from focus.env import Task
from focus.estimation import DirectBranchTd, noise_model
from focus.execution import Execution
from focus.noise_rows import ROUNDING, tree_rows
from focus.priority import Phase, Selective
from focus.synthetic import SyntheticCritic, SyntheticEnv, SyntheticPolicy, TreeMDP, critical_decision, synthetic_format
from focus.tree import Tree, Turn


def _turn(reward: float) -> Turn:
    return Turn((1,), (5, 5), (-0.5, -0.5), 1, "stop", reward=reward, transition=True)


def _scaled(mdp: TreeMDP, c: float) -> TreeMDP:
    outcomes = tuple(tuple(tuple((n, r * c, p) for n, r, p in a) for a in s) for s in mdp.outcomes)
    return dataclasses.replace(mdp, outcomes=outcomes)


def _batch_advantages(c: float) -> list[float]:
    """critical/2H with an exact critic, six tasks, seed 0 (the benchmark's cell that
    moved most), every reward times ``c``; the advantages divided by ``c``."""
    mdps = [_scaled(critical_decision(i), c) for i in range(6)]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=8)
    search = Selective(phases=(Phase("evidence", rollouts_per_task=1), Phase("continue", transitions=36)))
    col = Collector(
        agent,
        search,
        SyntheticCritic(mdps, [0.0] * len(mdps), seed=0),
        DirectBranchTd(),
        Execution(max_concurrency=16),
        collection_id="scale",
        seed=0,
    )
    batch = col.prepare(asyncio.run(col.search([Task(f"t{i}", {"mdp": i}) for i in range(6)])))
    return [r.advantage / c for r in batch.actor]


def test_the_batch_scales_with_the_rewards_unit() -> None:
    """The same plan and the same advantages in any unit: 1000 and 7.3 round their
    rewards differently from 1 (the fit's data then differ by rounding only), 2**-10
    exactly. Tolerance: the noise model is rounded to six significant digits."""
    base = _batch_advantages(1.0)
    assert any(abs(a) > 0.05 for a in base)
    for c in (1000.0, 7.3, 2.0**-10):
        assert _batch_advantages(c) == pytest.approx(base, rel=1e-4, abs=1e-6), c


def _coin_trees(n: int) -> list[Tree]:
    """A coin at the first step (reward ±0.5), then three steps of 0.1; an exact critic
    (0.3 at the root, 0.1 a step to go after the coin). Every checkpoint after the coin
    has a second child that ends at once with the rest of the return in one reward, so
    the spreads and the residuals there are 0 (up to rounding: 0.1 + 0.1 + 0.1 is not
    0.3); the root has one child, whose residual (v̂ − q)² = 0.25 is all a step's
    variance."""
    out = []
    for i in range(n):
        t = Tree.new(f"s{i}", None, (1,))
        t.nodes[t.ROOT].value = 0.3
        node = t.add_node(t.ROOT, (_turn(0.5 if i % 2 else -0.5),), "checkpoint", steps=1)
        for d in range(1, 4):
            node.value = 0.1 * (4 - d)
            t.add_node(node.id, (_turn(0.1 * (4 - d)),), "terminal", steps=d + 1)
            node = t.add_node(node.id, (_turn(0.1),), "checkpoint" if d < 3 else "terminal", steps=d + 1)
        out.append(t)
    return out


def test_an_exact_critic_lets_only_children_measure_the_step_variances() -> None:
    """Where every spread is 0 and the critic is exact (t = 0), the only-child
    residuals are Var(q) alone and weigh fully. Before, their weight was v²/(t + v)²
    with v the spreads' own (zero) variance: 0/0 read as 0, and the fit said no step
    adds any variance (or, where rounding left 1e-33 in a spread, the opposite)."""
    nm = noise_model(_coin_trees(40))
    assert nm.known and nm.spreads == 120
    assert nm.critic_var < 1e-4  # the prior's pseudo-residuals at a typical Q̄'s variance
    assert nm.step_var(0) > 0.05  # 0.25, blurred toward the later depths by the depth prior
    assert nm.step_var(0) > 10 * nm.step_var(2)


def test_siblings_that_differ_by_rounding_alone_agree() -> None:
    """0.1 + 0.2 in two turns against 0.3 in one differ by 5.6e-17: rounding, not a
    spread. A real difference of a millionth is kept."""
    for second, spread in ((0.3, 0.0), (0.3 + 1e-6, 0.5e-12)):
        t = Tree.new("r", None, (1,))
        t.nodes[t.ROOT].value = 0.3
        t.add_node(t.ROOT, (_turn(0.1), _turn(0.2)), "terminal", steps=2)
        t.add_node(t.ROOT, (_turn(second),), "terminal", steps=1)
        (row,) = tree_rows(t, 1.0, "bootstrap")
        assert row.ss == pytest.approx(spread, rel=1e-3, abs=0.0)
        assert (row.d2 == 0.0) == (spread == 0.0)
    assert 5.6e-17 / 0.3 < ROUNDING
