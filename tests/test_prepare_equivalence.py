"""The faster per-tree computations of batch preparation equal the computations they
replace, on random trees (issue 37: search and prepare CPU per transition).

Each reference below is the former code, kept here as the definition: the batch must
stay bit-identical (tests/repin.py), so every comparison is exact, not approximate.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from test_ranking import grow

from focus.estimation import (
    CriticTarget,
    DirectBranchTd,
    NodeMonteCarlo,
    Segment,
    critic_targets,
    first_step_weight,
    segment,
    tree_values,
)
from focus.search import copy_tree
from focus.tree import Edge, Tree


def reference_critic_targets(tree: Tree, gamma: float, truncation: str) -> dict[int, CriticTarget]:
    """``critic_targets`` as it was: a whole ``tree_values`` backup with κ = 0."""
    tv = tree_values(tree, gamma=gamma, kappa=0.0, truncation=truncation)  # type: ignore[arg-type]
    out: dict[int, CriticTarget] = {}
    for node in tree.checkpoints():
        q = tv.q_bar[node.id]
        if q is None:
            out[node.id] = CriticTarget(node.id, node.value if node.value is not None else 0.0, 0.0)
        else:
            out[node.id] = CriticTarget(node.id, q, float(tv.m[node.id]))
    return out


def random_trees(seed: int, steps: int = 10) -> list[Tree]:
    """A tree grown ``steps`` times as search grows one (chains below checkpoints,
    failed and truncated leaves, multi-transition segments, some nodes unscored), with
    every intermediate tree."""
    rng = random.Random(seed)
    tree = Tree.new("t", None, (1,))
    if rng.random() < 0.8:
        tree.root.value = rng.uniform(-0.5, 1.5)
    out = [tree]
    for _ in range(steps):
        tree = copy_tree(tree)
        grow(tree, rng)
        out.append(tree)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("gamma", "truncation"), [(1.0, "bootstrap"), (0.9, "bootstrap"), (0.97, "terminal")])
def test_critic_targets_equal_the_full_backup(seed: int, gamma: float, truncation: str) -> None:
    for tree in random_trees(seed):
        got = critic_targets(tree, gamma=gamma, truncation=truncation)  # type: ignore[arg-type]
        want = reference_critic_targets(tree, gamma, truncation)
        assert list(got) == list(want)  # same checkpoints, same order
        assert got == want  # bit for bit
    # the trees exercise every case: a checkpoint without a valid child, several valid children
    assert any(t.weight == 0.0 for t in got.values()) and any(t.weight >= 2 for t in got.values())


def reference_segment(e: Edge, gamma: float) -> Segment:
    """``segment`` as it was: one pass over the turns per property."""
    k = e.k
    return Segment(e.child, e.discounted_reward(gamma), gamma**k, first_step_weight(k, gamma), k, e.n_tokens)


def reference_td(edges: list[Edge], value: dict[int, float | None], gamma: float) -> dict[int, float]:
    """The segment TD advantages as ``_segment_td`` computed them, from the edges."""
    out = {}
    for e in edges:
        vc, vp = value.get(e.child), value.get(e.parent)
        if vc is not None and vp is not None:
            out[e.id] = e.discounted_reward(gamma) + gamma**e.k * vc - vp
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
def test_segments_and_advantages_equal_the_per_edge_computation(seed: int, gamma: float) -> None:
    tree = random_trees(seed)[-1]
    for e in tree.edges.values():
        got, want = segment(e, gamma), reference_segment(e, gamma)
        assert got == want and type(got.reward) is type(want.reward)
    for est in (DirectBranchTd(gamma=gamma), NodeMonteCarlo(gamma=gamma)):
        values = est.values(tree)
        assert set(values.segments) == set(tree.edges)
        edges = list(tree.edges.values())
        source = values.value if isinstance(est, DirectBranchTd) else values.mc
        want = reference_td(edges, dict(source), gamma)
        assert want and est.advantages(edges, values) == want
        # values without segments (as a ranking's) give the same advantages from the edges
        bare = dataclasses.replace(values, segments={})
        assert est.advantages(edges, bare) == want
