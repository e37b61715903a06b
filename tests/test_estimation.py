"""Refined values, advantages and targets: hand-computed trees and synthetic MDPs
whose exact values come from dynamic programming."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics

import pytest

from focus.agent import Agent
from focus.collector import Collector
from focus.critic import ConstantCritic, Critic
from focus.env import Task
from focus.estimation import (
    DirectBranchTd,
    GroupNormalized,
    NodeMonteCarlo,
    NoiseModel,
    critic_targets,
    noise_model,
    refine,
    tree_values,
    truncated_segments,
    value_influence,
)
from focus.node_view import node_evidence
from focus.priority import Calibration, NodeEvidence, Phase, Selective, Uniform
from focus.synthetic import (
    FAMILIES,
    SHAPES,
    SyntheticCritic,
    SyntheticEnv,
    SyntheticPolicy,
    read_state,
    synthetic_format,
)
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
    return run(col.search([Task(f"t{i}", {"mdp": i}) for i in range(n_tasks)]))


def advantage_mse(state, kappa: float | None = 0.0, noise=None, estimator=None) -> float:
    est = estimator or DirectBranchTd(kappa=None if noise is not None else kappa)
    se = n = 0.0
    for tree in state.trees:
        v = est.values(tree, noise)
        adv = est.advantages(list(tree.edges.values()), v)
        for e in tree.edges.values():
            turn = e.turns[0]
            task, s = read_state(turn.prompt_ids)
            exact = MDPS[task].advantage(s, turn.completion_ids[0] - 48, MDPS[task].values())
            se += (adv[e.id] - exact) ** 2
            n += 1
    return se / n


@pytest.mark.slow
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


@pytest.mark.slow
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
        influence=1.0,
        expected_transitions=4.0,
        child_tokens=2.0,
        signal=0.02,
        child_error=0.01,
        critic_var=0.01,
        fresh_error=0.02,
        chain_error=0.01,
    )
    base.update(kw)
    return NodeEvidence(**base)


def test_priority_ranks_by_the_error_one_more_continuation_removes():
    # the ranking's formula (the exploration draw, which ranks a few slots first whatever
    # they show, is tested in tests/test_noise_depth.py)
    p = Selective(explore=0.0)
    calm = ev()
    # where the actions' true advantages dominate the outcome noise, more siblings help;
    # where the env's randomness dominates, a branch adds error instead (only the order
    # matters: every continuation adds segments of its own, the budget is spent anyway)
    assert p(ev(signal=0.05, child_error=0.005, fresh_error=0.005)) > p(calm)
    assert p(ev(signal=0.002, child_error=0.05, fresh_error=0.05)) < p(calm)
    good = ev(signal=0.05, child_error=0.001, fresh_error=0.001, chain_error=0.0)
    noisy = ev(signal=0.002, child_error=0.05, fresh_error=0.05, chain_error=0.0)
    assert p(noisy) < p(good)
    more = dataclasses.replace(noisy, m=3, branches=3, child_tokens=3.0)
    assert p(more) < p(noisy)  # with noise dominating, every sibling's advantage carries more of it
    assert p(ev(influence=4.0)) > p(calm)  # its value is used more above it
    assert p(ev(m=6, branches=6, child_values=(0.5,) * 6, child_tokens=6.0)) < p(calm)  # already well sampled
    assert p(ev(pending=2)) < p(calm)  # a wave does not pile onto one node
    assert p(ev(chain_error=0.05)) < p(calm)  # a long fresh rollout adds poorly estimated segments
    # the budget is in transitions: a change is ranked per expected transition
    assert p(dataclasses.replace(good, expected_transitions=1.0)) == pytest.approx(4 * p(good))
    # an exact critic leaves nothing for evidence to fix at n itself
    assert p.error(ev(critic_var=0.0, signal=0.05, child_error=0.0), 3) == pytest.approx(0.0)
    # with an unknown model (no critic residual, no spread) nothing ranks above anything (as Uniform)
    assert p(ev(critic_var=math.inf)) == p(ev(critic_var=math.inf, signal=1.0)) == 0.0
    assert Uniform()(calm) == Uniform()(ev(child_values=(0.0, 1.0)))


def test_priority_counts_the_critic_targets_one_more_continuation_improves():
    """The target term (docs/algorithm.md, "Priorities"): a checkpoint's target counts
    ``Σ_j v_j/m``; a fresh child moves it to the mean over one more, adds its chain's own
    one-child targets and changes the parent's target by ``γ^{2k}/m_p`` times the change
    of its plain error. Its weight is the advantage/target error ratio of one fresh
    rollout."""
    p, no_targets = Selective(explore=0.0), Selective(explore=0.0, targets=False)
    node = ev(target_var=0.04, fresh_target=0.06, chain_target=0.1, target_influence=0.5, target_weight=2.0)
    own = (2 * 0.04 + 0.06) / 3 - 0.04
    upper = 0.5 * ((2 * 0.04 + 0.06) / 9 - 2 * 0.04 / 4)
    assert p.target_change(node) == pytest.approx(own + 0.1 + upper)
    assert p(node) == pytest.approx(no_targets(node) - 2.0 * (own + 0.1 + upper) / node.expected_transitions)
    # where the children's targets are noisy, a sibling improves them more: it ranks higher
    noisy_targets = dataclasses.replace(node, target_var=0.2)
    assert p(noisy_targets) > p(node) and no_targets(noisy_targets) == no_targets(node)
    # with an unknown model the weight is 0 and the targets rank nothing
    cal = Calibration(NoiseModel.unknown())
    assert cal.target_weight == 0.0
    known = Calibration(NoiseModel((0.04, 0.02, 0.01), 0.01, (0.02, 0.01, 0.005)), mean_leaf_transitions=3.0)
    chain = known.fresh_chain(0, 3)
    assert known.target_weight == pytest.approx(chain.segments / chain.targets)
    # a chain's plain backups carry the whole return variance below: R(d) = s(d) + R(d+1)
    assert chain.targets == pytest.approx(0.01 + (0.02 + 0.01) + (0.04 + 0.02 + 0.01))


def _leaf_turn(action: int, reward: float) -> Turn:
    return Turn((1,), (48 + action,), (-0.7,), 1, "stop", reward=reward)


def test_an_only_childs_critic_miss_is_evidence_of_its_checkpoints_variance_or_of_the_critic():
    """An only child shows no spread, but its critic miss ``(v̂ − q)²`` (expectation
    t + v) is evidence. A miss within the model's reach is read as the checkpoint's own
    one-child variance: ``(v̂ − q)² − t`` beside one pseudo-observation at the model,
    weighted by its precision against one degree of freedom of a spread,
    ``k = v²/(t + v)²``, scales the modelled variances by ``(1 + k·own/v)/(1 + k)``;
    where the critic predicted the child well, a continuation adds accurate segments
    and ranks higher. A miss many standard deviations out is read as the critic wrong
    at this checkpoint (issue 31, :func:`focus.weighting.checkpoint_critic_error`): the
    view's critic error there becomes the miss's own estimate ``(v̂ − q)² − v``, the
    child variances stay the model's, and the checkpoint ranks above a calm one, so
    that a second child tests the critic (the estimator reads the test from two
    children on)."""

    def view(cal: Calibration, reward: float, critic: float | None = 0.5) -> NodeEvidence:
        t = Tree.new("t", None, (1,))
        t.root.value = 0.5
        a = t.add_node(0, (_turn(),), "checkpoint", steps=1, context_ids=(1, 2))
        a.value = critic
        t.add_node(a.id, (_turn(reward),), "terminal", steps=2)
        return node_evidence(t, 0, DirectBranchTd().values(t, cal.noise), cal)[a.id]

    weights = []
    for t_err in (0.01, 1.0):
        cal = Calibration(NoiseModel((0.04, 0.02, 0.01), t_err, (0.02, 0.01, 0.005)), mean_leaf_transitions=3.0)
        # the critic's miss: 0, and one whose square exceeds t by 3
        calm, far = view(cal, 0.5), view(cal, 0.5 + math.sqrt(3.0 + t_err))
        # without a critic value there is no residual: the model's variance as it is
        blind = view(cal, 1.5, critic=None)
        v = blind.signal + blind.child_error
        k = v * v / (t_err + v) ** 2
        assert calm.signal + calm.child_error == pytest.approx(v / (1 + k))  # own = 0
        assert calm.critic_var == t_err
        c = far.critic_var
        k_far = v * v / (c + v) ** 2
        own = max(3.0 + t_err - c, 0.0)
        assert far.signal / blind.signal == pytest.approx((1 + k_far * own / v) / (1 + k_far))
        weights.append(k)
        if t_err == 0.01:
            # the miss is 17 standard deviations out: the critic is wrong here
            assert c == pytest.approx(3.0 + t_err - v, rel=1e-6)
            assert far.signal == pytest.approx(blind.signal)
            assert Selective(explore=0.0)(far) > Selective(explore=0.0)(calm)
        else:
            # 1.7 standard deviations: mostly the checkpoint's variance, the critic's
            # error barely moved, and the calm checkpoint ranks higher
            assert t_err < c < 1.1 * t_err
            assert far.signal / calm.signal > 1.0 + 0.5 * k * 3.0 / v
            assert Selective(explore=0.0)(calm) > Selective(explore=0.0)(far)
    # the model's one-child variance here is 0.02: a critic with half that error makes
    # its miss count 4/9 of a degree of freedom, one with 50 times it (t = 1) 1/2601
    assert weights == pytest.approx([4 / 9, 1 / 2601])


def test_the_weight_counts_the_segments_above_that_a_value_enters():
    """λ minimises the error of every advantage V(n) enters: with influence ι per child
    segment it is the blend (T + ι·Var(Q̄)) / ((1 + ι)(t + Var(Q̄))) of the advantage
    weight and the value weight, and an exact critic's weight rises toward 1 where the
    segments above read V(n), though n's own children are noisy."""
    noise = NoiseModel((0.04,), 0.002, (0.03,))
    kids = [(0.3, 1.0, 0.0, 0.0, 1.0), (0.7, 1.0, 0.0, 0.0, 1.0)]
    m = 2
    signal, var_q, t = (0.04 - 0.03) * m / m**2, 0.04 * m / m**2, 0.002
    alone = refine(0.6, kids, noise, 0, None)
    assert alone.weight == pytest.approx(signal / (t + var_q))
    iota = 1.5 / m
    above = refine(0.6, kids, noise, 0, None, influence=1.5)
    assert above.weight == pytest.approx((signal + iota * var_q) / ((1 + iota) * (t + var_q)))
    assert alone.weight < above.weight < var_q / (t + var_q)
    assert above.error == pytest.approx(above.weight**2 * t + (1 - above.weight) ** 2 * var_q)
    # the influence: V(c) enters its parent segment by γ^k(1 − 1/m_p) and each sibling's
    # by γ^k/m_p; an only child's change cancels
    assert value_influence(0.9, 3) == pytest.approx(0.81 * ((2 / 3) ** 2 + 2 * (1 / 3) ** 2))
    assert value_influence(1.0, 1) == 0.0
    # a fixed κ ignores it
    assert refine(0.6, kids, noise, 0, 2.0, influence=1.5).weight == pytest.approx(0.5)


def test_tree_values_weigh_a_checkpoint_by_its_parents_valid_children():
    """tree_values refines a checkpoint with the influence its parent's valid children
    give it (two here: each of the root's children weighs (2 − 1)/2 = 1/2), the numbers
    refine gives by hand; with one valid sibling failed, an only child's weight is its
    own children's alone."""
    noise = NoiseModel((0.04, 0.04), 0.002, (0.03, 0.03))
    kids = [(0.2, 1.0, 0.0, 0.0, 1.0), (0.6, 1.0, 0.0, 0.0, 1.0)]
    for failed, influence in ((False, 0.5), (True, 0.0)):
        t = Tree.new("t", None, (1,))
        t.root.value = 0.5
        mids = []
        for j in range(2):
            if failed and j:
                t.add_node(0, (_turn(),), "failed", steps=1, cause="model: down")
                continue
            mid = t.add_node(0, (_turn(),), "checkpoint", steps=1, context_ids=(1, 2 + j))
            mid.value = 0.5
            for r in (0.2, 0.6):
                t.add_node(mid.id, (_turn(r),), "terminal", steps=2)
            mids.append(mid.id)
        tv = tree_values(t, noise=noise)
        want = refine(0.5, kids, noise, 1, None, influence=influence).weight
        assert [tv.critic_weight[i] for i in mids] == pytest.approx([want] * len(mids))
    assert refine(0.5, kids, noise, 1, None, influence=0.5).weight > refine(0.5, kids, noise, 1, None).weight


def test_refine_weighs_the_critic_by_signal_against_noise():
    noise = NoiseModel((0.04,), 0.01, (0.01,))
    kids = [(0.3, 1.0, 0.0, 0.0, 1.0), (0.7, 1.0, 0.0, 0.0, 1.0), (0.2, 1.0, None, 0.0, 1.0)]
    r = refine(0.6, kids, noise, 0, None)
    m = 2
    signal, var_q = (0.04 - 0.01) * m / m**2, 0.04 * m / m**2
    lam = signal / (0.01 + var_q)
    assert r.weight == pytest.approx(lam) and r.q_bar == pytest.approx(0.5)
    assert r.value == pytest.approx(lam * 0.6 + (1 - lam) * 0.5)
    assert r.error == pytest.approx(lam**2 * 0.01 + (1 - lam) ** 2 * var_q)
    # an exact critic (t = 0) with exact children gets all the weight; a fixed κ keeps κ/(κ+m)
    assert refine(0.6, kids, NoiseModel((0.04,), 0.0, (0.0,)), 0, None).weight == pytest.approx(1.0)
    assert refine(0.6, kids, noise, 0, 2.0).weight == pytest.approx(0.5)
    # an unknown model (no spreads yet) is a plain backup
    assert refine(0.6, kids, NoiseModel.unknown(), 0, None).value == pytest.approx(0.5)


def test_noise_model_recovers_known_variances():
    """Depth-1 trees: four sampled actions of two (true advantages ±0.2, so variance
    0.04), an outcome noise of variance 0.01 on every reward, a critic off by variance
    0.02. The fit is deterministic (seeded data); tolerances ~4 standard errors."""
    rng = random.Random(0)
    trees = []
    for i in range(600):
        t = Tree.new(f"t{i}", None, (1,))
        base = rng.uniform(0, 1)
        t.root.value = base + rng.gauss(0, 0.02**0.5)
        for _ in range(4):
            a = int(rng.random() < 0.5)
            t.add_node(0, (_leaf_turn(a, base + (0.2 if a else -0.2) + rng.gauss(0, 0.1)),), "terminal", steps=1)
        trees.append(t)
    nm = noise_model(trees)
    assert nm.known and nm.spreads == 600 and nm.repeats == 600  # four draws of two actions always repeat one
    assert nm.step_var(0) == pytest.approx(0.04 + 0.01, rel=0.15)
    assert nm.noise_var(0) == pytest.approx(0.01, rel=0.15)
    assert nm.critic_var == pytest.approx(0.02, rel=0.2)
    chain = Tree.new("c", None, (1,))
    chain.add_node(chain.add_node(0, (_turn(),), "checkpoint", steps=1).id, (_turn(1.0),), "terminal", steps=2)
    unknown = noise_model([chain])  # no critic value and no spread: nothing to fit
    assert not unknown.known and unknown.critic_var == math.inf
    assert tree_values(chain, noise=unknown).value[0] == pytest.approx(1.0)  # a plain backup


def test_the_envs_share_of_the_variance_carries_to_depths_without_repeated_actions():
    """Depth-2 trees: the root's two children took different actions (no repeat, so
    depth 0 alone cannot split its variance), each child's four leaves repeat actions.
    Rewards at depth 1 are ±0.2 by action, plus outcome noise of variance 0.01 in the
    stochastic case. The share ν/s measured at depth 1 (0, or 0.01/0.05) is the prior
    for depth 0, not a coin flip's half: a deterministic env is deterministic
    everywhere (with the half, ν(0) was 0.10·s(0) here). With noise, depth 0's ν lies
    between the two priors' pulls: the neighbour's ν(1) and the share times s(0).
    Seeded data; tolerances well beyond the fit's spread over seeds."""

    def trees(noise: float, seed: int) -> list[Tree]:
        rng = random.Random(seed)
        out = []
        for i in range(300):
            t = Tree.new(f"t{i}", None, (1,))
            for first in (0, 1):
                c = t.add_node(0, (_leaf_turn(first, 0.0),), "checkpoint", steps=1)
                shift = rng.gauss(0.0, 0.3)  # what the first action decides
                for _ in range(4):
                    a = int(rng.random() < 0.5)
                    reward = shift + (0.2 if a else -0.2) + rng.gauss(0.0, noise)
                    t.add_node(c.id, (_leaf_turn(a, reward),), "terminal", steps=2)
            out.append(t)
        return out

    exact = noise_model(trees(0.0, 0))
    assert exact.noise_var(1) < 1e-3 * exact.step_var(1)
    assert exact.step_var(0) > 0.02
    assert exact.noise_var(0) < 0.02 * exact.step_var(0)  # was half of it before the share was pooled
    noisy = noise_model(trees(0.1, 1))
    share = noisy.noise_var(1) / noisy.step_var(1)
    assert share == pytest.approx(0.01 / 0.05, abs=0.05)
    assert 0.9 * noisy.noise_var(1) < noisy.noise_var(0) < 1.1 * share * noisy.step_var(0)


def _late_spread_trees(rng: random.Random, n: int) -> list[Tree]:
    """``n`` rollouts of 8 steps with an exact critic: steps 0-5 add a variance of
    0.001 to the return, steps 6-7 of 0.02 (a late coin flip); only the checkpoint at
    depth 7 got a second child, as a search that branched where the spread is."""
    sds = [0.001**0.5] * 6 + [0.02**0.5] * 2
    trees = []
    for i in range(n):
        t = Tree.new(f"s{i}", None, (1,))
        drift = rng.uniform(-0.05, 0.05)  # the true value at depth d: drift·(8 − d)
        node = t.root
        for step in range(1, 8):
            node.value = drift * (9 - step)
            node = t.add_node(node.id, (_turn(drift + rng.gauss(0.0, sds[step - 1])),), "checkpoint", steps=step)
        node.value = drift
        for _ in range(2):
            t.add_node(node.id, (_turn(drift + rng.gauss(0.0, sds[7])),), "terminal", steps=8)
        trees.append(t)
    return trees


def test_depths_without_spreads_are_read_off_their_only_childs_residuals():
    """Spreads only at depth 7 (variance 0.02 there) leave depths 0-5 (variance 0.001)
    to the prior that neighbouring depths are alike, which carried depth 7's variance up
    to them (0.0193 at every depth here). The residuals of the only children
    above measure them (an exact critic: each has expectation the variance still to come)."""
    nm = noise_model(_late_spread_trees(random.Random(3), 300))
    assert nm.known and nm.spreads == 300
    assert statistics.fmean(nm.step_var(d) for d in range(5)) < 0.003
    assert nm.step_var(7) == pytest.approx(0.02, rel=0.25)
    assert nm.critic_var < 0.003


def _chains(rng: random.Random, n: int) -> list[Tree]:
    """``n`` rollouts that never branched: 8 steps, each reward of mean 0 and variance
    0.01, a critic off by variance 0.02 at every checkpoint."""
    trees = []
    for i in range(n):
        t = Tree.new(f"c{i}", None, (1,))
        node = t.root
        for step in range(1, 9):
            node.value = rng.gauss(0.0, 0.02**0.5)
            kind = "terminal" if step == 8 else "checkpoint"
            node = t.add_node(node.id, (_turn(rng.gauss(0.0, 0.1)),), kind, steps=step)
        trees.append(t)
    return trees


@pytest.mark.slow  # statistical: many seeded fits
def test_noise_model_of_unbranched_rollouts_splits_critic_error_from_return_variance():
    """Rollouts that never branched (no spread): 8 steps, each reward of mean 0 and
    variance 0.01, a critic off by variance 0.02 at every checkpoint. A residual at a
    checkpoint with k steps to go has expectation ``0.02 + 0.01·k``; its profile over k
    tells the critic's error (the part that does not grow with k) from the return's.
    Seeded data; tolerances ~4 standard errors (measured over 20 seeds)."""
    nm = noise_model(_chains(random.Random(1), 2000))
    assert nm.known and nm.spreads == 0 and nm.residuals == 2000 * 8
    assert nm.critic_var == pytest.approx(0.02, abs=0.01)
    assert sum(nm.step_var(d) for d in range(8)) == pytest.approx(0.08, abs=0.01)
    # nothing tells the actions from the env's randomness without siblings: half each
    assert nm.noise_var(3) == pytest.approx(nm.step_var(3) / 2, rel=1e-5)  # (six significant digits)


@pytest.mark.slow  # statistical: many seeded fits
def test_the_unbranched_model_of_a_few_rollouts_does_not_lock_depths_at_zero():
    """Six rollouts of 8 steps (one per task of a small collection), every step of
    variance 0.01, a critic off by 0.02. Each residual weighs one degree of freedom: with
    weights inverse to the previous pass's variances, a depth the first pass put at zero
    made the residuals ending there look exact, their weight grew without bound and the
    depth stayed at zero (3.75 of the 8 depths per fit over these 200 seeds, root mean
    square error of s 0.0171; now 1.74 and 0.0103)."""
    zeros, errors = 0, []
    for seed in range(200):
        nm = noise_model(_chains(random.Random(seed), 6))
        zeros += sum(nm.step_var(d) == 0.0 for d in range(8))
        errors.append(statistics.fmean((nm.step_var(d) - 0.01) ** 2 for d in range(8)) ** 0.5)
    assert zeros / 200 < 2.5
    assert statistics.fmean(errors) < 0.013


def test_a_constant_critic_leaves_the_unbranched_noise_model_unknown():
    """One prediction for every state (an untrained or constant critic), a return decided
    at the first step: every checkpoint of a rollout misses by the same amount, whatever
    the depth that decides, so the residuals cannot locate it. The model stays unknown
    (the ranking flat, as uniform branching's) instead of declaring every step's variance
    zero; the same rollouts with a critic that varies are fitted, and once two
    rollouts share a checkpoint the constant critic's error is fitted from their spread."""
    rng = random.Random(2)

    def rollouts(critic) -> list[Tree]:
        trees = []
        for i in range(200):
            t = Tree.new(f"c{i}", None, (1,))
            node, win = t.root, rng.random() < 0.3
            for step in range(1, 7):
                node.value = critic(win, step)
                reward = float(win) if step == 6 else 0.0
                node = t.add_node(node.id, (_turn(reward),), "terminal" if step == 6 else "checkpoint", steps=step)
            trees.append(t)
        return trees

    constant = noise_model(rollouts(lambda win, step: 0.3))
    assert not constant.known and constant.critic_var == math.inf and constant.residuals == 200 * 6
    varying = noise_model(rollouts(lambda win, step: 0.3 if step == 1 else float(win) + rng.gauss(0, 0.1)))
    assert varying.known and math.isfinite(varying.critic_var)
    branched = rollouts(lambda win, step: 0.3)
    for t in branched[:50]:
        t.add_node(0, (_turn(float(rng.random() < 0.3)),), "terminal", steps=1)
    assert noise_model(branched).known


def test_noise_model_of_spreads_without_transitions_is_quiet_and_finite():
    """Siblings whose segments hold no task transition (tool turns only, as in the browse
    example) inform no depth's variance: the fit rests on its prior, without numpy's
    "mean of empty slice" warning."""
    import warnings

    trees = []
    for i in range(4):
        t = Tree.new(f"t{i}", None, (1,))
        t.root.value = 0.5
        t.add_node(0, (_turn(1.0, transition=False),), "terminal", steps=0)
        t.add_node(0, (_turn(0.0, transition=False),), "terminal", steps=0)
        trees.append(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nm = noise_model(trees)
    assert nm.known and nm.spreads == 4 and math.isfinite(nm.critic_var) and nm.step_var(0) == 0.0


def test_truncated_leaves_bootstrap_or_count_as_terminal():
    t = hand_tree()
    boot = tree_values(t, kappa=0.0)
    term = tree_values(t, kappa=0.0, truncation="terminal")
    assert boot.value[5] == 0.3 and term.value[5] == 0.0
    assert boot.q_bar[0] == pytest.approx((boot.value[1] + 0.3) / 2)
    assert term.q_bar[0] == pytest.approx(term.value[1] / 2)
    assert critic_targets(t, truncation="terminal")[0].target == pytest.approx(term.q_bar[0])
    assert truncated_segments(t) == {4}


@pytest.mark.slow  # statistical: many seeded fits
def test_the_critic_is_trusted_as_far_as_the_evidence_shows_it_deserves():
    """Exact critic: a large weight and advantages far better than per-node Monte Carlo's
    (not exact: the fit cannot rule out some env noise and critic error from finitely
    many spreads). Constant critic: a weight near 0 and nothing worse than per-node
    Monte Carlo by more than a few percent."""
    more = Phase("more", transitions=150, wave_size=16, wave_unit="jobs")
    search = Uniform(phases=[Phase("evidence", rollouts_per_task=2), more])
    exact_w, const_w, ratios = [], [], []
    for seed in range(4):
        state = collect(search, SyntheticCritic(MDPS, 0.0), seed=seed)
        est = DirectBranchTd()
        nm = est.noise(state.trees)
        exact_w += [
            w for t in state.trees for n, w in est.values(t, nm).critic_weight.items() if not t.nodes[n].is_leaf
        ]
        assert advantage_mse(state, noise=nm) < 0.25 * advantage_mse(state, estimator=NodeMonteCarlo())
        state = collect(search, ConstantCritic(0.5), seed=seed)
        nm = est.noise(state.trees)
        const_w += [
            w for t in state.trees for n, w in est.values(t, nm).critic_weight.items() if not t.nodes[n].is_leaf
        ]
        ratios.append(advantage_mse(state, noise=nm) / advantage_mse(state, estimator=NodeMonteCarlo()))
    assert statistics.fmean(exact_w) > 0.4
    assert statistics.fmean(const_w) < 0.2
    assert statistics.fmean(ratios) < 1.05, ratios


class _ScaledEnv(SyntheticEnv):
    """The synthetic MDPs with every reward multiplied by ``scale``."""

    def __init__(self, mdps: list, scale: float) -> None:
        super().__init__(mdps)
        self.scale = scale

    async def step(self, state, action, workspace, *, seed=None):
        r = await super().step(state, action, workspace, seed=seed)
        return dataclasses.replace(r, reward=r.reward * self.scale)


class _ScaledCritic(Critic):
    def __init__(self, inner: Critic, scale: float) -> None:
        self.inner, self.scale = inner, scale

    async def predict(self, contexts):
        return [v * self.scale for v in await self.inner.predict(contexts)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_plans_and_advantages_do_not_depend_on_the_reward_scale(family: str) -> None:
    """Rewards and critic in other units (x100, x0.01): the same checkpoints are
    continued, and advantages and critic targets scale with the rewards. Nothing
    assumes returns in [0, 1]: every variance, prior and floor of the noise model and
    the ranking is relative to the collection's own spreads. (The model is rounded to six
    significant digits, decimal scales keep that rounding; the tolerance is far above
    float64 rounding through a few hundred operations, far below any real change.)"""
    fam = FAMILIES[family]
    mdps = [fam.make(7 + i) for i in range(3)]

    def batch(scale: float):
        agent = Agent(SyntheticPolicy(mdps), _ScaledEnv(mdps, scale), synthetic_format(), max_steps=fam.horizon + 2)
        noise = [m.advantage_scale(fam.gamma) for m in mdps]
        critic = _ScaledCritic(SyntheticCritic(mdps, noise, seed=3, gamma=fam.gamma), scale)
        phases = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=5 * fam.horizon * len(mdps)))
        col = Collector(
            agent, Selective(phases=phases), critic, DirectBranchTd(gamma=fam.gamma), collection_id="s", seed=1
        )
        return run(col.collect([Task(f"t{i}", {"mdp": i}) for i in range(len(mdps))]))

    base = batch(1.0)
    assert len(base.actor) > 3 * fam.horizon  # branched, not only the evidence rollouts
    for scale in (100.0, 0.01):
        other = batch(scale)
        assert [(r.prompt_ids, r.completion_ids) for r in other.actor] == [
            (r.prompt_ids, r.completion_ids) for r in base.actor
        ]
        for r, s in zip(base.actor, other.actor, strict=True):
            assert s.advantage == pytest.approx(r.advantage * scale, rel=1e-9, abs=1e-12 * scale)
        for r, s in zip(base.critic, other.critic, strict=True):
            assert s.target == pytest.approx(r.target * scale, rel=1e-9, abs=1e-12 * scale)
