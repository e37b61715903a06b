"""The critic's error t(d) read off the exploration continuations (issue 31;
``noise_model(probe=share)``, :func:`probe_critic`).

The branched checkpoints' residuals see the critic only where the ranking chose to
branch, which it does where the critic's miss looked small. A continuation slot drawn
for exploration (:func:`focus.priority.explores`) is placed by a fixed hash of (tree
index, node id, branch), whatever the critic says, so the checkpoints whose second slot
was drawn are a sample of the checkpoints at each depth that nothing the collection saw
chose. Each has two children the ranking did not pick: its first (the rollout that made
it) and the drawn one, with λ = 0 backed-up values ``q₀``, ``q₁``; ``(v̂ − q₀)(v̂ − q₁)``
is then an unbiased estimate of the critic's squared miss there, ``(v̂ − V)²``, with no
model of Var(q) (the two children are independent given the state). Their mean per
depth, pooled with neighbouring depths as t(d) is (:func:`focus.noise._critic_by_depth`)
and shrunk toward the branched fit where rows are few, is the critic's error where the
search did not look. The draw's rate is the same at
every depth, so the rows need no weights for where they were placed. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from focus.draws import explore_draw
from focus.lsq import depth_walk
from focus.noise_rows import DEPTH_BUCKETS
from focus.segments import segment
from focus.tree import Edge, Node, Tree
from focus.weighting import Truncation

#: Pseudo-rows of the probe's prior (as :func:`focus.noise._critic_by_depth`'s, each worth
#: one row): neighbouring depths alike, and no correction to the branched fit.
_DEPTH_PRIOR_DOF = 8.0
_POOL_PRIOR_DOF = 2.0


def mean_rollout(trees: Sequence[Tree]) -> float:
    """The mean transitions from the root of the trees' valid leaves (the search's
    ``Calibration.mean_leaf_transitions``, which sets the exploration rate; 1 without)."""
    total = count = 0
    for tree in trees:
        for node in tree.nodes.values():
            if node.is_leaf and node.kind != "failed":
                total += node.transitions
                count += 1
    return total / count if total else 1.0


def probe_rows(
    trees: Sequence[Tree],
    share: float,
    gamma: float,
    truncation: Truncation,
    keep: Callable[[Tree, Edge], bool] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(depth bucket, (v̂ − q₀)(v̂ − q₁))`` of each checkpoint whose second slot was drawn
    for exploration at ``share`` (rate ``share/(1 + L̄)``, :func:`mean_rollout`) and has
    both of its first two children valid. ``trees`` in the search's order: a tree's index
    is its position (a tree passed alone draws as tree 0, a sample still placed by the
    hash but not the one the search explored)."""
    rate = share / (1.0 + max(mean_rollout(trees), 0.0))
    depths: list[int] = []
    rows: list[float] = []
    for ti, tree in enumerate(trees):
        picked = [
            n
            for n in tree.nodes.values()
            if n.kind == "checkpoint"
            and n.value is not None
            and len(n.children) >= 2
            and explore_draw(ti, n.id, 1) < rate
        ]
        if not picked:
            continue
        values = _plain_values(tree, gamma, truncation, keep)
        for node in picked:
            pair = _first_two(tree, node, keep)
            if pair is None:
                continue
            qs = []
            for e in pair:
                vc = values.get(e.child)
                if vc is None:
                    break
                sg = segment(e, gamma)
                qs.append(sg.reward + sg.discount * vc)
            if len(qs) == 2:
                v = float(node.value)  # type: ignore[arg-type]
                depths.append(min(node.depth, DEPTH_BUCKETS - 1))
                rows.append((v - qs[0]) * (v - qs[1]))
    return np.array(depths, dtype=np.int64), np.array(rows, dtype=np.float64)


def _first_two(tree: Tree, node: Node, keep: Callable[[Tree, Edge], bool] | None) -> tuple[Edge, Edge] | None:
    """``node``'s slot-0 and slot-1 child edges: by the tree's log (the rollout that made
    the node, and the continuation of branch 1 from it), else its first two children."""
    edges = [tree.edges[e] for e in node.children]
    log = tree.log
    first = second = None
    for e in edges:
        rec = log[e.rollout] if e.rollout < len(log) else None
        if rec is None or rec.rollout != e.rollout:  # a tree not grown by search (no log)
            first, second = edges[0], edges[1]
            break
        branch = rec.branch if rec.node == node.id else 0
        if branch == 0 and first is None:
            first = e
        elif branch == 1 and second is None:
            second = e
    if first is None or second is None:
        return None
    if keep is not None and not (keep(tree, first) and keep(tree, second)):
        return None
    return first, second


def _plain_values(
    tree: Tree, gamma: float, truncation: Truncation, keep: Callable[[Tree, Edge], bool] | None
) -> dict[int, float | None]:
    """Every node's λ = 0 backed-up value, as :func:`focus.noise_rows.collect` forms it:
    terminal 0, truncated v̂ (bootstrap) or 0, failed None, a checkpoint the mean of its
    valid children's ``r + γ^k V`` (its own v̂ without one)."""
    val: dict[int, float | None] = {}
    boot = truncation == "bootstrap"
    for i in sorted(tree.nodes, reverse=True):  # children before parents
        node = tree.nodes[i]
        if node.kind == "terminal":
            val[i] = 0.0
        elif node.kind == "truncated":
            val[i] = node.value if boot else 0.0
        elif node.kind != "checkpoint":
            val[i] = None
        else:
            qs = []
            for eid in node.children:
                e = tree.edges[eid]
                vc = val.get(e.child)
                if vc is None or (keep is not None and not keep(tree, e)):
                    continue
                sg = segment(e, gamma)
                qs.append(sg.reward + sg.discount * vc)
            val[i] = sum(qs) / len(qs) if qs else node.value
    return val


def probe_critic(depths: np.ndarray, rows: np.ndarray, base: np.ndarray, *, only: bool = False) -> np.ndarray:
    """t(d) given the probe's rows (:func:`probe_rows`) and the branched residuals' t(d),
    ``base``: the rows' mean per depth less ``base`` is the correction δ(d), with
    ``_DEPTH_PRIOR_DOF`` pseudo-rows that neighbouring depths are alike and
    ``_POOL_PRIOR_DOF`` at 0, each worth one row (the shrinkage
    :func:`focus.noise._critic_by_depth` gives t(d)): a depth with few rows leans on its
    neighbours and keeps the branched fit where there are none. ``base + max(δ, 0)``
    (only where the probe says the critic is worse), or with ``only`` ``max(base + δ, 0)``.
    Every row weighs the same: its variance is not modelled (the estimate reads no model).
    ``base`` itself without rows."""
    nd = len(base)
    keep = depths < nd
    depths, rows = depths[keep], rows[keep]
    if not len(rows):
        return base
    count, total = np.zeros(nd), np.zeros(nd)
    np.add.at(count, depths, 1.0)
    np.add.at(total, depths, rows - base[depths])
    mat = np.diag(count) + _DEPTH_PRIOR_DOF * depth_walk(nd) + _POOL_PRIOR_DOF * np.eye(nd)
    delta = np.linalg.solve(mat, total)
    return np.maximum(base + delta, 0.0) if only else base + np.maximum(delta, 0.0)
