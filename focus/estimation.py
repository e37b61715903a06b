"""Learning signals from a search tree: refined values, advantages, critic targets.

Everything here is a pure function of :class:`~focus.tree.Tree` objects (with the
critic's predictions filled in): no I/O, no randomness. ``docs/algorithm.md`` gives
every formula with its derivation; the short version:

* refined value ``V(n) = λ(n)·v̂(n) + (1 − λ(n))·Q̄(n)`` where
  ``Q̄(n) = mean_j [r(e_j) + γ^k(e_j)·V(c_j)]`` over the ``m`` valid child segments.
  Values are backed up through children (not averaged over every rollout passing n),
  so a subtree that search continued more often does not get more weight;
* the critic's weight ``λ(n)`` comes from evidence (:class:`NoiseModel`, fitted on
  the collection's own trees): the variance a transition adds to a return at each
  depth, the part of it that is not the action's doing (siblings that took the same
  action still differ by it) and the critic's error variance. λ(n) is the weight
  that minimises the error of the advantages V(n) enters: n's child segments' and,
  where n has siblings, its parent segment's and theirs (:func:`value_influence`). A
  fixed ``κ`` instead gives the classic ``λ = κ/(κ + m)``;
* terminal leaf ``V = 0``; truncated leaf ``V = v̂`` (``truncation="bootstrap"``, the
  default) or ``0`` (``"terminal"``); failed leaf: no value, and its segment is left
  out of its parent's backup, of advantages and of targets;
* :class:`DirectBranchTd`: ``A(e) = r(e) + γ^k(e)·V(c) − V(p)``;
* critic targets (:func:`critic_targets`) use their own backup with ``λ = 0`` and
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

from focus.backups import (
    Refined,
    TreeValues,
    child_variances,
    node_value,
    refine,
    settle_children,
    tree_values,
    value_influence,
)
from focus.noise import (
    DEPTH_BUCKETS,
    NoiseModel,
    Truncation,
    first_step_weight,
    leaf_value,
    noise_model,
)
from focus.noise_rows import Checkpoint
from focus.segments import Segment, reward_and_k, segment
from focus.sums import left_sum
from focus.tree import Edge, Tree

__all__ = [
    "DEPTH_BUCKETS",
    "CriticTarget",
    "DirectBranchTd",
    "Estimator",
    "GroupNormalized",
    "NodeMonteCarlo",
    "NoiseModel",
    "Refined",
    "Segment",
    "TreeValues",
    "Truncation",
    "child_variances",
    "critic_targets",
    "first_step_weight",
    "leaf_value",
    "node_value",
    "noise_model",
    "refine",
    "segment",
    "settle_children",
    "tree_values",
    "truncated_segments",
    "value_influence",
]


class Estimator(BaseModel, abc.ABC):
    """Assigns an advantage to each segment. Implement :meth:`advantages`.

    ``values`` computes the per-node statistics the rule reads; ``noise`` fits the
    noise model once per collection (the collector calls it with every tree and passes
    the result to ``values``). Segments left out of the returned dict (failed ones)
    are not trained on.

    A frozen pydantic model: ``gamma``, ``kappa`` and ``truncation`` are set by keyword
    (``MyRule(gamma=0.9)``), and a subclass's own parameters are annotated fields
    (``scale: float = 0.5``). Pydantic refuses ``self.scale = ...`` in an ``__init__``
    (the instance is frozen), and ``gamma = 0.9`` or ``scale = 0.5`` without an
    annotation in the class body.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gamma: float = Field(1.0, ge=0.0, le=1.0)
    #: Fixed weight of the critic as pseudo-counts (λ = κ/(κ+m)); None: from the
    #: collection's own residuals (empirical Bayes, see docs/algorithm.md). Finite: κ = ∞
    #: (λ = 1) made every refined value ∞/∞ = NaN, which the batch refuses only after
    #: the whole collection ran.
    kappa: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    #: A truncated leaf (step or context limit) bootstraps from the critic, or counts
    #: as terminal (value 0).
    truncation: Truncation = "bootstrap"

    def noise(self, trees: Sequence[Tree], rows: Sequence[Sequence[Checkpoint]] | None = None) -> NoiseModel:
        """``rows``: each tree's noise rows at this γ and truncation rule, if known
        (:func:`focus.noise.noise_model`'s; a search state keeps them)."""
        return noise_model(trees, gamma=self.gamma, truncation=self.truncation, rows=rows)

    def values(
        self, tree: Tree, noise: NoiseModel | None = None, segments: Mapping[int, Segment] | None = None
    ) -> TreeValues:
        """``segments``: the tree's edge segments at this γ known already (:func:`tree_values`'s)."""
        if noise is None and self.kappa is None:
            noise = self.noise([tree])
        return tree_values(
            tree, gamma=self.gamma, kappa=self.kappa, noise=noise, truncation=self.truncation, segments=segments
        )

    @abc.abstractmethod
    def advantages(self, edges: Sequence[Edge], values: TreeValues) -> dict[int, float]:
        """``{edge_id: advantage}`` for the segments that get a learning signal: a
        finite number each; a segment left out gets none (a ``None``, NaN or text is a
        :class:`~focus.batch_schema.BatchError` naming the estimator)."""


def _segment_td(
    edges: Sequence[Edge], value: Mapping[int, float | None], gamma: float, segments: Mapping[int, Segment]
) -> dict[int, float]:
    """``r(e) + γ^k(e) V(c) − V(p)`` for each segment whose two ends have a value; ``r(e)``
    and ``γ^k`` from ``segments`` (the backup's, at the same γ) where it holds the edge."""
    out: dict[int, float] = {}
    for e in edges:
        vc, vp = value.get(e.child), value.get(e.parent)
        if vc is not None and vp is not None:
            sg = segments.get(e.id)
            if sg is not None and sg.child == e.child:
                out[e.id] = sg.reward + sg.discount * vc - vp
            else:
                out[e.id] = e.discounted_reward(gamma) + gamma**e.k * vc - vp
    return out


class DirectBranchTd(Estimator):
    """Segment TD advantage over refined values: ``A(e) = r(e) + γ^k V(c) − V(p)``."""

    def advantages(self, edges: Sequence[Edge], values: TreeValues) -> dict[int, float]:
        return _segment_td(edges, values.value, values.gamma, values.segments)


class GroupNormalized(Estimator):
    """GRPO: every segment gets the normalised return of the rollouts through it.

    The group is every complete root-to-leaf path of the tree (for independent rollouts
    from the root, the classic GRPO group); the scale is the group's population standard
    deviation (verl divides by the sample one). ``scale=False`` only centres (Dr. GRPO),
    which keeps advantages in reward units for comparisons.
    """

    scale: bool = True
    #: Added to the standard deviation (verl's 1e-6); 0 is the exact normalisation.
    eps: float = Field(1e-6, ge=0.0, allow_inf_nan=False)

    def advantages(self, edges: Sequence[Edge], values: TreeValues) -> dict[int, float]:
        rets = values.leaf_returns
        if not rets:
            return {}
        if min(rets) == max(rets):
            # all success or all failure: no signal. The mean of equal returns may round
            # off their value (0.1 * 3 / 3), and that rounding over the std of the
            # rounding (1e-17), or over eps = 0, gave every segment -1.0, or raised
            # ZeroDivisionError
            return {e.id: 0.0 for e in edges if values.root_return.get(e.child) is not None}
        mu = left_sum(rets) / len(rets)
        sd = math.sqrt(left_sum((r - mu) ** 2 for r in rets) / len(rets)) if self.scale else 1.0
        out: dict[int, float] = {}
        for e in edges:
            g = values.root_return.get(e.child)
            if g is not None:
                out[e.id] = (g - mu) / (sd + self.eps) if self.scale else g - mu
        return out


class NodeMonteCarlo(Estimator):
    """VinePPO-style: ``A(e) = r(e) + γ^k V_MC(c) − V_MC(p)`` with ``V_MC(n)`` the mean
    return of every rollout passing n. Biased wherever how many continuations run below
    a child depends on what happened there: with selective branching (the subtrees
    search favoured) and with uniform branching too (a longer episode makes more
    checkpoints to continue from; docs/algorithm.md measures it). The reason
    DirectBranchTd backs up through children instead."""

    def advantages(self, edges: Sequence[Edge], values: TreeValues) -> dict[int, float]:
        return _segment_td(edges, values.mc, values.gamma, values.segments)


@dataclass(frozen=True)
class CriticTarget:
    node_id: int
    target: float
    weight: float


def critic_targets(
    tree: Tree,
    *,
    gamma: float = 1.0,
    truncation: Truncation = "bootstrap",
    segments: Mapping[int, Segment] | None = None,
) -> dict[int, CriticTarget]:
    """One target per checkpoint: the λ = 0 backup Q̄(n) with weight m(n).

    Independent of the actor estimator by construction. A checkpoint with no valid
    continuation gets weight 0 (its target is its own prediction, or 0).

    The same numbers as ``tree_values(tree, kappa=0.0)``'s ``q_bar`` and ``m``, in the
    same order of operations, computed without the rest of it (errors, weights, Monte
    Carlo and root returns, none of which a target reads): with κ = 0 a checkpoint's
    value is its plain mean ``Q̄`` (its prediction without a valid child) and a leaf's is
    :func:`leaf_value`'s. That was a second full backup of every tree in
    ``Collector.prepare`` (0.008 ms of 0.038 per transition at 40k transitions).
    ``segments``: edge segments at ``gamma`` known already (the backup's,
    :attr:`TreeValues.segments`): a segment's reward and discount are the numbers
    :func:`reward_and_k` gives.
    """
    known = segments if segments is not None else {}
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    nodes, edges = tree.nodes, tree.edges
    value: dict[int, float | None] = {}
    out: dict[int, CriticTarget] = {}
    for i in sorted(nodes, reverse=True):  # children before parents (Tree.postorder)
        node = nodes[i]
        if node.kind != "checkpoint":
            value[i] = leaf_value(node.kind, node.value, truncation, 0.0)[0]
            continue
        qs = []
        for eid in node.children:
            e = edges[eid]
            vc = value[e.child]
            if vc is not None:
                sg = known.get(eid)
                if sg is not None and sg.child == e.child:
                    qs.append(sg.reward + sg.discount * vc)
                else:
                    reward, k = reward_and_k(e.turns, gamma)
                    qs.append(reward + gamma**k * vc)
        if qs:
            q = value[i] = left_sum(qs) / len(qs)
            out[i] = CriticTarget(i, q, float(len(qs)))
        else:
            value[i] = node.value
            out[i] = CriticTarget(i, node.value if node.value is not None else 0.0, 0.0)
    # in node order, as tree.checkpoints() gives them
    return {i: out[i] for i in nodes if i in out}


def truncated_segments(tree: Tree) -> set[int]:
    """Ids of the segments that end in a truncated leaf (flagged in the batch)."""
    return {e.id for e in tree.edges.values() if tree.nodes[e.child].kind == "truncated"}
