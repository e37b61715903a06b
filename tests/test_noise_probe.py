"""t(d) read off the continuations drawn for exploration (issue 31;
``noise_model(probe=share)``, :mod:`focus.noise_probe`).

Synthetic trees of 8-step chains (:mod:`tests.test_noise_joint`'s steps and critic): the
ranking gives a checkpoint of the first rollout a second child only where the critic's
miss there is small (so where the critic is wrong it branches where it happened to be
right, and its residuals there say the critic is nearly exact); besides, each
checkpoint's second slot is drawn for exploration by the search's own hash
(:func:`focus.draws.explore_draw`) at the rate ``share/(1 + L̄)`` and then gets its
second child whatever the critic says. The branched residuals see a critic that is
right; the drawn pairs see what it is."""

from __future__ import annotations

import random
import statistics

import numpy as np

from focus.draws import explore_draw
from focus.noise import noise_model
from focus.noise_probe import probe_critic, probe_rows
from focus.priority import Selective
from focus.tree import Tree
from tests.test_noise_joint import STEPS, _turn

#: Exact at depths 0-3, an error of variance 0.01 from depth 4 on.
_CRITIC_SD = [0.0] * 4 + [0.1] * 4
#: The ranking's second children (where the critic's miss is under half its deviation).
_RANKED = [0.6] * 8
_SHARE = 0.5


def _trees(rng: random.Random, n: int, critic_sd: list[float], step_sd: float = 0.05) -> list[Tree]:
    rate = _SHARE / (1.0 + STEPS)  # every leaf ends at STEPS transitions
    out = []
    for ti in range(n):
        tree = Tree.new(f"p{ti}", None, (1,))

        def run(node_id: int, depth: int, first: bool, tree: Tree = tree, ti: int = ti) -> None:
            node = tree.nodes[node_id]
            while True:
                err = rng.gauss(0.0, critic_sd[depth])
                node.value = err  # every reward has mean 0: the true value is 0
                kind = "terminal" if depth == STEPS - 1 else "checkpoint"
                drawn = explore_draw(ti, node.id, 1) < rate
                ranked = rng.random() < _RANKED[depth] and abs(err) <= 0.5 * critic_sd[depth]
                nxt = tree.add_node(node.id, (_turn(rng.gauss(0.0, step_sd)),), kind, steps=depth + 1)
                if first and (drawn or ranked):
                    second = tree.add_node(node.id, (_turn(rng.gauss(0.0, step_sd)),), kind, steps=depth + 1)
                    if kind == "checkpoint":
                        run(second.id, depth + 1, False)
                if kind == "terminal":
                    return
                node, depth = nxt, depth + 1

        run(tree.ROOT, 0, True)
        out.append(tree)
    return out


def test_a_critic_wrong_only_where_search_does_not_branch_is_seen_by_the_probe() -> None:
    """The branched residuals (main's t(d)) put t(4-7) near 0, where it is 0.01; with the
    drawn pairs read t(4-7) comes to 0.0083-0.0087 on these seeds (0.0055-0.009 on seeds
    0-5; main's 0.0013-0.0034), and the exact depths stay near 0. Fails on main's fit
    (``probe`` off)."""
    for seed in (1, 2, 3):
        trees = _trees(random.Random(seed), 200, _CRITIC_SD)
        before = noise_model(trees)
        after = noise_model(trees, probe=_SHARE)
        assert statistics.fmean(before.critic_vars[4:]) < 0.003, (seed, before.critic_vars)
        assert 0.006 < statistics.fmean(after.critic_vars[4:]) < 0.014, (seed, after.critic_vars)
        assert statistics.fmean(after.critic_vars[:3]) < 0.003, (seed, after.critic_vars)  # 0.0002-0.0026


def test_an_exact_critic_stays_near_zero() -> None:
    """With an exact critic the drawn pairs' products have mean 0: t(d) moves by little
    (the max form keeps only what they add, so upward, never down: the largest t(d) 0.001
    -> 0.001-0.0037 on these seeds, against the step below's variance 0.0025-0.0175)."""
    for seed in range(3):
        trees = _trees(random.Random(10 + seed), 200, [0.0] * STEPS)
        before, after = noise_model(trees), noise_model(trees, probe=_SHARE)
        assert all(a >= b for a, b in zip(after.critic_vars, before.critic_vars, strict=True))
        assert max(after.critic_vars) < 0.005, (seed, after.critic_vars)


def test_the_rows_are_the_drawn_checkpoints_and_the_correction_shrinks() -> None:
    """Each row is a checkpoint whose slot 1 the hash drew, ``(v̂ − q₀)(v̂ − q₁)``; a depth
    without rows keeps the branched fit, and one row moves it by less than its own size."""
    trees = _trees(random.Random(5), 40, _CRITIC_SD)
    depths, rows = probe_rows(trees, _SHARE, 1.0, "bootstrap")
    rate = _SHARE / (1.0 + STEPS)
    drawn = sum(
        1
        for ti, t in enumerate(trees)
        for n in t.nodes.values()
        if n.kind == "checkpoint" and len(n.children) >= 2 and explore_draw(ti, n.id, 1) < rate
    )
    assert len(rows) == len(depths) == drawn > 0
    base = np.full(8, 0.002)
    assert probe_critic(np.zeros(0, np.int64), np.zeros(0), base).tolist() == base.tolist()
    one = probe_critic(np.array([5]), np.array([0.102]), base)
    assert 0.002 < one[5] < 0.102 and min(one) >= 0.002
    assert probe_critic(np.array([5]), np.array([-1.0]), base).tolist() == base.tolist()  # max form: never below
    assert probe_critic(np.array([5]), np.array([-1.0]), base, only=True)[5] == 0.0


def test_the_driver_sets_the_exploration_share_of_selective_only() -> None:
    from benchmarks import estimator_quality
    from benchmarks.noise_variant import EXPLORE, VARIANTS, _explore

    assert set(EXPLORE) <= set(VARIANTS) and VARIANTS["probe100"]["probe"] == EXPLORE["probe100"]
    sel, _ = _explore(estimator_quality.make_search, 1.0, "selective", 1, 100)
    uni, _ = _explore(estimator_quality.make_search, 1.0, "uniform", 1, 100)
    assert isinstance(sel, Selective) and sel.explore == 1.0 and not hasattr(uni, "explore")
