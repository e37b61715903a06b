"""Learning signals from a search tree: refined values, advantages, critic targets.

Everything here is a pure function of a :class:`~focus.tree.Tree` (with the critic's
predictions filled in): no I/O, no randomness. ``docs/algorithm.md`` gives every
formula with its bias argument; the short version:

* refined value ``V(n) = (κ·v̂(n) + m·Q̄(n)) / (κ + m)`` where
  ``Q̄(n) = mean_j [r(e_j) + γ^k(e_j)·V(c_j)]`` over the ``m`` valid child segments.
  Values are backed up through children (not averaged over every rollout passing n),
  so a subtree that search continued more often does not get more weight;
* terminal leaf ``V = 0``; truncated leaf ``V = v̂`` (bootstrap); failed leaf: no value,
  and its segment is left out of its parent's backup, of advantages and of targets;
* :class:`DirectBranchTd`: ``A(e) = r(e) + γ^k(e)·V(c) − V(p)``;
* critic targets (:func:`critic_targets`) use their own backup with ``κ = 0`` and
  weight ``m(n)``, so changing the actor estimator never changes them.

Baselines for comparison: :class:`GroupNormalized` (GRPO) and :class:`NodeMonteCarlo`
(VinePPO-style per-node Monte Carlo).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from focus.tree import Edge, Tree


@dataclass(frozen=True)
class TreeValues:
    """Per-node statistics of one tree that estimators read (all keyed by node id).

    ``value`` is ``None`` where nothing can be known: failed leaves, truncated leaves
    without a critic prediction, and checkpoints with no valid continuation and no
    prediction. Segments touching such a node get no advantage.
    """

    gamma: float
    #: κ(n) used for each node's refined value.
    kappa: Mapping[int, float]
    kind: Mapping[int, str]
    v_hat: Mapping[int, float | None]
    #: Refined value V(n).
    value: Mapping[int, float | None]
    #: Mean backed-up child value Q̄(n) (None when m(n) = 0).
    q_bar: Mapping[int, float | None]
    #: Backed-up values r(e_j) + γ^k V(c_j) of the valid children, in child order.
    child_q: Mapping[int, tuple[float, ...]]
    #: Number of valid child segments m(n).
    m: Mapping[int, int]
    #: Plain Monte Carlo value: mean return from n over every valid leaf below n.
    mc: Mapping[int, float | None]
    #: Mean discounted return from the root of the valid leaves below n.
    root_return: Mapping[int, float | None]
    #: Discounted returns from the root of every valid leaf (one per complete rollout path).
    leaf_returns: tuple[float, ...]


def _kappa_of(kappa: float | Mapping[int, float], node: int) -> float:
    return kappa.get(node, 0.0) if isinstance(kappa, Mapping) else kappa


def tree_values(tree: Tree, *, gamma: float = 1.0, kappa: float | Mapping[int, float] = 1.0) -> TreeValues:
    """Back values up from the leaves to the root (children before parents).

    ``kappa`` may be one number or a per-node mapping (see ``AdaptiveKappa`` in the
    docs: κ(n) from the critic's reported uncertainty).
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    kind = {i: n.kind for i, n in tree.nodes.items()}
    v_hat = {i: n.value for i, n in tree.nodes.items()}
    value: dict[int, float | None] = {}
    q_bar: dict[int, float | None] = {}
    child_q: dict[int, tuple[float, ...]] = {}
    m: dict[int, int] = {}
    mc_sum: dict[int, float] = {}
    mc_n: dict[int, int] = {}
    # Per segment, once: (child, discounted reward, γ^k); read again by every pass below.
    edges = tree.edges
    seg = {i: (e.child, e.discounted_reward(gamma), gamma**e.k) for i, e in edges.items()}
    for node in tree.postorder():
        i = node.id
        if node.kind == "terminal":
            value[i], mc_sum[i], mc_n[i] = 0.0, 0.0, 1
        elif node.kind == "truncated":
            value[i] = node.value
            mc_sum[i], mc_n[i] = (node.value or 0.0, 1) if node.value is not None else (0.0, 0)
        elif node.kind == "failed":
            value[i], mc_sum[i], mc_n[i] = None, 0.0, 0
        else:
            qs: list[float] = []
            s, cnt = 0.0, 0
            for eid in node.children:
                child, dr, disc = seg[eid]
                vc = value[child]
                if vc is not None:
                    qs.append(dr + disc * vc)
                if mc_n[child]:
                    s += mc_n[child] * dr + disc * mc_sum[child]
                    cnt += mc_n[child]
            child_q[i] = tuple(qs)
            m[i] = len(qs)
            q_bar[i] = sum(qs) / len(qs) if qs else None
            k = _kappa_of(kappa, i)
            vh = node.value
            if not qs:
                value[i] = vh
            elif vh is None or k <= 0:
                value[i] = q_bar[i]
            else:
                value[i] = (k * vh + len(qs) * sum(qs) / len(qs)) / (k + len(qs))
            mc_sum[i], mc_n[i] = s, cnt
    mc = {i: (mc_sum[i] / mc_n[i] if mc_n[i] else None) for i in tree.nodes}
    # Returns from the root: prefix rewards top-down (ids grow downward).
    prefix: dict[int, tuple[float, float]] = {tree.ROOT: (0.0, 1.0)}  # (discounted reward so far, discount)
    for i in sorted(tree.nodes):
        node = tree.nodes[i]
        if node.parent_edge is not None:
            r, d = prefix[edges[node.parent_edge].parent]
            _, dr, disc = seg[node.parent_edge]
            prefix[i] = (r + d * dr, d * disc)
    ret_sum: dict[int, float] = {}
    ret_n: dict[int, int] = {}
    leaf_returns: list[float] = []
    for node in tree.postorder():
        i = node.id
        if node.is_leaf:
            v = value[i]
            if v is None:
                ret_sum[i], ret_n[i] = 0.0, 0
            else:
                g = prefix[i][0] + prefix[i][1] * v
                ret_sum[i], ret_n[i] = g, 1
                leaf_returns.append(g)
        else:
            ret_sum[i] = sum(ret_sum[seg[eid][0]] for eid in node.children)
            ret_n[i] = sum(ret_n[seg[eid][0]] for eid in node.children)
    root_return = {i: (ret_sum[i] / ret_n[i] if ret_n[i] else None) for i in tree.nodes}
    return TreeValues(
        gamma,
        {i: _kappa_of(kappa, i) for i in tree.nodes},
        kind,
        v_hat,
        value,
        q_bar,
        child_q,
        m,
        mc,
        root_return,
        tuple(leaf_returns[::-1]),
    )


def node_kappa(tree: Tree, kappa: float, return_variance: float, kappa_max: float) -> float | dict[int, float]:
    """Per-node κ from the critic's reported uncertainty; ``kappa`` where none is reported.

    Treating v̂(n) as a prior with variance s(n)² and each backed-up child value as an
    observation with variance ``return_variance``, the posterior mean is the refined
    value with κ(n) = return_variance / s(n)².
    """
    if all(n.value_std is None for n in tree.nodes.values()):
        return kappa
    out: dict[int, float] = {}
    for i, n in tree.nodes.items():
        s = n.value_std
        out[i] = kappa if s is None else (kappa_max if s <= 0 else min(kappa_max, return_variance / (s * s)))
    return out


class Estimator(BaseModel, abc.ABC):
    """Assigns an advantage to each segment. Implement :meth:`advantages`.

    ``values`` computes the per-node statistics the rule reads; override it to change
    how values are refined (e.g. a per-node κ). Segments left out of the returned dict
    (failed ones) are not trained on.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gamma: float = Field(1.0, ge=0.0, le=1.0)
    kappa: float = Field(1.0, ge=0.0)
    #: When the critic reports an uncertainty s(n), use κ(n) = return_variance / s(n)²
    #: (the Bayes weight of a prediction against sampled returns; capped at kappa_max).
    adaptive_kappa: bool = False
    return_variance: float = Field(0.25, gt=0.0)
    kappa_max: float = Field(1e4, gt=0.0)

    def node_kappa(self, tree: Tree) -> float | dict[int, float]:
        return node_kappa(tree, self.kappa, self.return_variance, self.kappa_max) if self.adaptive_kappa else self.kappa

    def values(self, tree: Tree) -> TreeValues:
        return tree_values(tree, gamma=self.gamma, kappa=self.node_kappa(tree))

    @abc.abstractmethod
    def advantages(self, edges: Sequence[Edge], values: TreeValues) -> dict[int, float]:
        """``{edge_id: advantage}`` for the segments that get a learning signal."""


def _segment_td(edges: Sequence[Edge], value: Mapping[int, float | None], gamma: float) -> dict[int, float]:
    """``r(e) + γ^k(e) V(c) − V(p)`` for each segment whose two ends have a value."""
    out: dict[int, float] = {}
    for e in edges:
        vc, vp = value.get(e.child), value.get(e.parent)
        if vc is not None and vp is not None:
            out[e.id] = e.discounted_reward(gamma) + gamma**e.k * vc - vp
    return out


class DirectBranchTd(Estimator):
    """Segment TD advantage over refined values: ``A(e) = r(e) + γ^k V(c) − V(p)``."""

    def advantages(self, edges: Sequence[Edge], values: TreeValues) -> dict[int, float]:
        return _segment_td(edges, values.value, values.gamma)


class GroupNormalized(Estimator):
    """GRPO: every segment gets the normalised return of the rollouts through it.

    The group is every complete root-to-leaf path of the tree (for independent rollouts
    from the root, the classic GRPO group). ``scale=False`` only centres (Dr. GRPO),
    which keeps advantages in reward units for comparisons.
    """

    scale: bool = True
    eps: float = 1e-6

    def advantages(self, edges: Sequence[Edge], values: TreeValues) -> dict[int, float]:
        rets = values.leaf_returns
        if not rets:
            return {}
        mu = sum(rets) / len(rets)
        sd = math.sqrt(sum((r - mu) ** 2 for r in rets) / len(rets)) if self.scale else 1.0
        out: dict[int, float] = {}
        for e in edges:
            g = values.root_return.get(e.child)
            if g is not None:
                out[e.id] = (g - mu) / (sd + self.eps) if self.scale else g - mu
        return out


class NodeMonteCarlo(Estimator):
    """VinePPO-style: ``A(e) = r(e) + γ^k V_MC(c) − V_MC(p)`` with ``V_MC(n)`` the mean
    return of every rollout passing n. Unbiased only when continuations are spread
    evenly; with selective branching the mean over-weights the subtrees search
    favoured (the reason DirectBranchTd backs up through children instead)."""

    def advantages(self, edges: Sequence[Edge], values: TreeValues) -> dict[int, float]:
        return _segment_td(edges, values.mc, values.gamma)


@dataclass(frozen=True)
class CriticTarget:
    node_id: int
    target: float
    weight: float


def critic_targets(tree: Tree, *, gamma: float = 1.0) -> dict[int, CriticTarget]:
    """One target per checkpoint: the κ = 0 backup Q̄(n) with weight m(n).

    Independent of the actor estimator by construction. A checkpoint with no valid
    continuation gets weight 0 (its target is its own prediction, or 0).
    """
    tv = tree_values(tree, gamma=gamma, kappa=0.0)
    out: dict[int, CriticTarget] = {}
    for node in tree.checkpoints():
        q = tv.q_bar[node.id]
        if q is None:
            out[node.id] = CriticTarget(node.id, node.value if node.value is not None else 0.0, 0.0)
        else:
            out[node.id] = CriticTarget(node.id, q, float(tv.m[node.id]))
    return out
