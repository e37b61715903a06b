"""Refined values, advantages and targets: hand-computed trees and synthetic MDPs
whose exact values come from dynamic programming."""

from __future__ import annotations

import statistics

import pytest

from focus.agent import Agent
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.env import Task
from focus.estimation import DirectBranchTd, GroupNormalized, NodeMonteCarlo, critic_targets, tree_values
from focus.priority import NodeEvidence, Phase, Selective, Uniform
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, read_state, synthetic_format
from focus.testing import run
from focus.tree import Tree, Turn


def _turn(reward: float = 0.0, n: int = 2, transition: bool = True) -> Turn:
    return Turn((1,), (5,) * n, (-0.5,) * n, 1, "stop", reward=reward, transition=transition)


def hand_tree() -> Tree:
    """root(v̂=.5) -> a(v̂=.4) -> {terminal r=1, terminal r=0, failed}; root -> truncated(v̂=.3)."""
    t = Tree.new("t", None, (1,))
    t.root.value = 0.5
    a = t.add_node(0, (_turn(),), "checkpoint", steps=1, context_ids=(1, 2))
    a.value = 0.4
    t.add_node(a.id, (_turn(1.0),), "terminal", steps=2)
    t.add_node(a.id, (_turn(0.0), _turn(0.0, transition=False)), "terminal", steps=3)
    t.add_node(a.id, (), "failed", steps=1, cause="model: down")
    tr = t.add_node(0, (_turn(),), "truncated", steps=1, context_ids=(1, 3))
    tr.value = 0.3
    return t


def test_refined_values_and_advantages_by_hand():
    t = hand_tree()
    v = tree_values(t, gamma=1.0, kappa=1.0)
    assert v.m[1] == 2 and v.q_bar[1] == pytest.approx(0.5)  # the failed child is left out
    assert v.value[1] == pytest.approx((1 * 0.4 + 2 * 0.5) / 3)
    assert v.value[5] == 0.3 and v.value[4] is None  # truncated bootstraps, failed has none
    assert v.q_bar[0] == pytest.approx((v.value[1] + 0.3) / 2)
    assert v.value[0] == pytest.approx((0.5 + 2 * v.q_bar[0]) / 3)
    adv = DirectBranchTd(kappa=1.0).advantages(list(t.edges.values()), v)
    assert adv[1] == pytest.approx(1.0 - v.value[1]) and adv[2] == pytest.approx(0.0 - v.value[1])
    assert adv[0] == pytest.approx(v.value[1] - v.value[0]) and adv[4] == pytest.approx(0.3 - v.value[0])
    assert 3 not in adv  # the failed segment gets no learning signal
    # discounting uses the segment's transitions only (the second turn of edge 2 made none)
    g = tree_values(t, gamma=0.5, kappa=0.0)
    assert g.value[1] == pytest.approx((1.0 + 0.0) / 2)  # rewards inside a segment: γ^0, γ^1, ...
    assert g.value[0] == pytest.approx((0.5 * g.value[1] + 0.5 * 0.3) / 2)


def test_targets_do_not_depend_on_the_estimator():
    t = hand_tree()
    targets = critic_targets(t, gamma=1.0)
    assert targets[1].target == pytest.approx(0.5) and targets[1].weight == 2
    assert targets[0].weight == 2 and targets[0].target == pytest.approx((0.5 + 0.3) / 2)
    for est in (DirectBranchTd(kappa=5.0), GroupNormalized(), NodeMonteCarlo()):
        est.advantages(list(t.edges.values()), est.values(t))
        assert critic_targets(t, gamma=1.0) == targets


def test_baselines_by_hand():
    t = hand_tree()
    v = tree_values(t, gamma=1.0, kappa=0.0)
    assert sorted(v.leaf_returns) == [0.0, 0.3, 1.0]
    grpo = GroupNormalized(scale=False).advantages(list(t.edges.values()), v)
    mu = 1.3 / 3
    assert grpo[1] == pytest.approx(1 - mu) and grpo[0] == pytest.approx(0.5 - mu) and 3 not in grpo
    mc = NodeMonteCarlo().advantages(list(t.edges.values()), v)
    assert v.mc[0] == pytest.approx(mu) and mc[0] == pytest.approx(0.5 - mu)


MDPS = [SHAPES["critical"](i) for i in range(3)]


def collect(search, critic, seed: int, n_tasks: int = 3):
    mdps = MDPS[:n_tasks]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=10)
    col = Collector(agent, search, critic, DirectBranchTd(kappa=0.0), seed=seed)
    return run(col.run_search([Task(f"t{i}", {"mdp": i}) for i in range(n_tasks)]))


def advantage_mse(state, kappa: float = 0.0) -> float:
    est = DirectBranchTd(kappa=kappa)
    se = n = 0.0
    for tree in state.trees:
        v = est.values(tree)
        adv = est.advantages(list(tree.edges.values()), v)
        for e in tree.edges.values():
            turn = e.turns[0]
            task, s = read_state(turn.prompt_ids)
            exact = MDPS[task].advantage(s, turn.completion_ids[0] - 48, MDPS[task].values())
            se += (adv[e.id] - exact) ** 2
            n += 1
    return se / n


def test_values_and_advantages_converge_as_budget_grows():
    errs = []
    for budget in (20, 160, 1200):
        search = Uniform(
            phases=[
                Phase("evidence", rollouts_per_task=2),
                Phase("more", transitions=budget, wave_size=32, max_branches=64),
            ]
        )
        state = collect(search, ConstantCritic(0.5), seed=1)
        value_err = statistics.fmean(
            (tree_values(t, kappa=0.0).value[n.id] - MDPS[i].values()[read_state(n.context_ids)[1]]) ** 2
            for i, t in enumerate(state.trees)
            for n in t.checkpoints()
        )
        errs.append((value_err, advantage_mse(state)))
    assert errs[2][0] < errs[0][0] and errs[2][1] < errs[1][1] < errs[0][1]
    assert errs[2][0] < 0.05 and errs[2][1] < 0.03, errs


def test_selective_branching_leaves_root_values_unbiased():
    """Over many seeds, the κ = 0 backed-up root value of selectively branched trees
    averages to the exact value."""
    search = Selective(
        phases=[Phase("evidence", rollouts_per_task=2), Phase("more", transitions=60, wave_size=4, max_branches=8)],
        kappa=0.0,
    )
    backed = []
    truth = [m.values()[0] for m in MDPS]
    for seed in range(40):
        state = collect(search, SyntheticCritic(MDPS, noise=0.2, seed=seed), seed=seed)
        for i, t in enumerate(state.trees):
            v = tree_values(t, kappa=0.0)
            backed.append(v.value[0] - truth[i])
    mean, se = statistics.fmean(backed), statistics.stdev(backed) / len(backed) ** 0.5
    assert abs(mean) < 3 * se + 0.01, (mean, se)
    assert statistics.fmean(abs(x) for x in backed) < 0.3


def ev(**kw) -> NodeEvidence:
    base = dict(
        tree_index=0,
        node_id=1,
        depth=1,
        transitions=1,
        value=0.5,
        value_std=None,
        refined=0.5,
        q_bar=0.5,
        child_values=(0.5, 0.5),
        m=2,
        branches=2,
        pending=0,
        influence=3.0,
        expected_transitions=4.0,
    )
    base.update(kw)
    return NodeEvidence(**base)


def test_priority_prefers_uncertain_influential_cheap_checkpoints():
    p = Selective(kappa=1.0)
    calm = ev()
    assert p(ev(child_values=(0.0, 1.0), q_bar=0.5)) > p(calm)  # children disagree
    assert p(ev(value=0.95, q_bar=0.3, child_values=(0.3, 0.3))) > p(ev(value=0.3, q_bar=0.3, child_values=(0.3, 0.3)))
    assert p(ev(influence=9.0)) > p(calm)  # its value is used more
    assert p(ev(m=6, branches=6, child_values=(0.5,) * 6)) < p(calm)  # already well sampled
    assert p(ev(pending=2)) < p(calm)  # a wave does not pile onto one node
    assert p(ev(expected_transitions=1.0)) > p(calm)  # cheaper to continue
    assert p(ev(refined=0.99, value=0.99, q_bar=0.99, child_values=(0.99, 0.99))) < p(calm)  # prior V(1-V)
    assert Uniform()(calm) == Uniform()(ev(child_values=(0.0, 1.0)))
