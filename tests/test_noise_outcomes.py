"""The env's share of a transition's variance, read off siblings that took the same
action: where they all met the same outcome (the same observation and reward) the env
added nothing between them on that transition (docs/algorithm.md, "The noise model")."""

from __future__ import annotations

import random

from focus.estimation import noise_model, tree_values
from focus.noise_rows import tree_rows
from focus.tree import Tree, Turn

#: One decision at depth 1 (the good action, probability 0.3, is worth 0.8 at the end);
#: every other step has one action; the env is deterministic.
P_GOOD, PAYOFF, DEPTH = 0.3, 0.8, 6
VALUE = P_GOOD * PAYOFF


def _turn(action: int, obs: str, reward: float = 0.0) -> Turn:
    return Turn((1,), (action,), (-0.5,), 1, "stop", reward=reward, transition=True, observation=obs)


def _decided(t: Tree, node: int, good: bool) -> None:
    """From a depth-2 checkpoint, the deterministic steps to the end (one action each)."""
    for d in range(2, DEPTH):
        last = d == DEPTH - 1
        turn = _turn(3, f"s={d + 1},{int(good)}", PAYOFF * good if last else 0.0)
        child = t.add_node(node, (turn,), "terminal" if last else "checkpoint", steps=d + 1)
        child.value = None if last else PAYOFF * good
        node = child.id


def _critical(rng: random.Random, n: int, roots: int = 3) -> list[Tree]:
    """``n`` trees as uniform branching grows them on a task whose only decision is at
    depth 1: ``roots`` continuations of the root's one action (they all reach the same
    state, whose observation they share), each one rollout through the decision; an
    exact critic (the true value at every checkpoint)."""
    out = []
    for i in range(n):
        t = Tree.new(f"c{i}", None, (1,))
        t.root.value = VALUE
        for _ in range(roots):
            one = t.add_node(t.ROOT, (_turn(2, "s=1"),), "checkpoint", steps=1)
            one.value = VALUE
            good = rng.random() < P_GOOD
            two = t.add_node(one.id, (_turn(7 if good else 8, f"s=2,{int(good)}"),), "checkpoint", steps=2)
            two.value = PAYOFF * good
            _decided(t, two.id, good)
        out.append(t)
    return out


def test_same_action_siblings_that_met_the_same_outcome_show_a_deterministic_env() -> None:
    """A deterministic env with one decision at depth 1 and an exact critic. The root's
    continuations took the same action and met the same outcome, so their spread is the
    decision's below them, not the env's at the root: the env's variance is 0 at every
    depth (it was 0.037, 0.032 and 0.020 at depths 0-2, where the depth prior's blur of
    the decision was read as the env's noise), and with no noise beyond the actions'
    advantages the exact critic gets nearly the whole weight at the root and at the
    decision (it was 0.02 and 0.60 there; 0.987 and 0.999 now). Tolerances: the env's variance
    against the decision's 0.134, the weight against its former shortfall."""
    trees = _critical(random.Random(3), 80)
    nm = noise_model(trees)
    assert nm.known and nm.repeats == 80
    assert max(nm.noise_var(d) for d in range(DEPTH)) < 1e-3
    for t in trees[:10]:
        tv = tree_values(t, noise=nm)
        for node in t.nodes.values():
            if not node.is_leaf and node.depth <= 1:
                assert tv.critic_weight[node.id] > 0.98


def test_same_action_siblings_that_met_different_outcomes_still_measure_the_env() -> None:
    """The same trees with the root's one action answered at random (observation and
    reward differ, a coin worth ±0.3): the env's variance at the root is fitted near its
    0.09, not read as deterministic. Tolerance: a third of it (80 trees, 160 degrees of
    freedom of same-action spread, the depth prior)."""
    rng = random.Random(4)
    trees = _critical(rng, 80)
    for t in trees:
        for eid in t.root.children:
            e = t.edges[eid]
            coin = rng.random() < 0.5
            e.turns = (_turn(2, f"s=1,{int(coin)}", 0.3 if coin else -0.3),)
            t.nodes[e.child].value = VALUE  # the critic: the state's value after the coin, less the coin
    nm = noise_model(trees)
    assert abs(nm.noise_var(0) - 0.09) < 0.03


def test_rows_mark_the_groups_whose_outcomes_agree() -> None:
    """The rows record, per child, whether its same-action group met one outcome."""
    trees = _critical(random.Random(5), 1)
    rows = tree_rows(trees[0], 1.0, "bootstrap")
    (root,) = [r for r in rows if r.level == 0]
    assert root.ss_same is not None and [k[3:] for k in root.kids] == [(2 / 3, True)] * 3
