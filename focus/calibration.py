"""The collection-wide quantities the ranking reads (docs/algorithm.md, "Priorities").

:class:`Calibration` holds the noise model, the mean segment length and the mean leaf
depth, fitted on the collection so far (:func:`calibrate`); :meth:`Calibration.fresh_chain`
what a fresh rollout adds below a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from focus.estimation import NoiseModel, Truncation, noise_model
from focus.noise_rows import Checkpoint
from focus.tree import Edge, Tree


@dataclass(frozen=True)
class Calibration:
    """Collection-wide quantities the ranking reads, fitted on the collection so far.

    ``noise`` is the estimator's noise model (:func:`focus.estimation.noise_model`);
    ``mean_tokens`` the mean completion tokens of a segment (the unit of influence);
    ``mean_leaf_transitions`` the mean transitions from the root to a valid leaf (the
    cost of a continuation from a checkpoint without a valid child).
    """

    noise: NoiseModel
    mean_tokens: float = 1.0
    mean_leaf_transitions: float = 1.0
    gamma: float = 1.0
    #: Share of the valid leaves that bootstrap on the critic (truncated, with the
    #: ``bootstrap`` rule): how often a fresh rollout's last value is the critic's.
    bootstrapped: float = 0.0
    _chains: dict[tuple[int, int], Chain] = field(default_factory=dict, compare=False, repr=False)
    #: :attr:`target_weight`, once computed (every evidence view reads it); not an
    #: ``__init__`` argument, so ``dataclasses.replace`` starts a copy without it.
    _target_weight: list[float] = field(default_factory=list, init=False, compare=False, repr=False)
    #: :meth:`at_depth`'s answers, by depth (not an ``__init__`` argument either).
    _depths: dict[int, tuple[float, float, float, float]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def at_depth(self, depth: int) -> tuple[float, float, float, float]:
        """The noise model at ``depth``: ``(step_var, action_var, noise_var, critic_at)``,
        the same numbers, computed once per depth: every evidence view reads all four of
        its checkpoint's depth (about 100,000 views per ranking rebuild at 100k
        transitions over 2,000 tasks, a handful of depths)."""
        hit = self._depths.get(depth)
        if hit is None:
            noise = self.noise
            hit = self._depths[depth] = (
                noise.step_var(depth),
                noise.action_var(depth),
                noise.noise_var(depth),
                noise.critic_at(depth),
            )
        return hit

    def fresh_chain(self, depth: int, length: int) -> Chain:
        """What a fresh rollout adds below its first checkpoint at ``depth``, with
        ``length`` one-transition segments below it to an exact leaf (a chain of only
        children, weighed as :func:`focus.estimation.refine` would), see :class:`Chain`.

        With one child of signal a and noise E (ν plus γ² times the next value's
        error), the weight is ``λ = a/(a + E + t)``, the segment's error
        ``λ²(E + t) + (1−λ)²a`` and the value's ``λ²t + (1−λ)²(a + E)``. A plain
        backup (a critic target) of a checkpoint with one child carries the whole
        return variance below it: ``R(d) = s(d) + γ²R(d+1)``.
        """
        key = (depth, length)
        hit = self._chains.get(key)
        if hit is not None:
            return hit
        noise, g2 = self.noise, self.gamma * self.gamma
        value_err = seg_err = plain = targets = 0.0
        for d in range(depth + length - 1, depth - 1, -1):
            t = noise.critic_error_at(d)
            a = noise.action_var(d)
            e = noise.noise_var(d) + g2 * value_err
            lam = a / (a + e + t) if noise.known and a + e + t > 0 else 0.0
            seg_err += (lam * lam * (e + t) if lam > 0 else 0.0) + (1 - lam) ** 2 * a
            value_err = (lam * lam * t if lam > 0 else 0.0) + (1 - lam) ** 2 * (a + e)
            plain = noise.step_var(d) + g2 * plain
            targets += plain
        out = self._chains[key] = Chain(value_err, seg_err, plain, targets)
        return out

    @property
    def target_weight(self) -> float:
        """How much one unit of summed critic-target error counts against one unit of
        summed advantage error in the ranking: their ratio along one fresh rollout from
        a root of the mean leaf depth (:meth:`fresh_chain`), the unit both errors come
        in when no search is done. Ranking by ``Δ(adv) + w·Δ(targets)`` with that ``w``
        is ranking by the relative changes ``Δ(adv)/adv₀ + Δ(targets)/targets₀``, so
        neither error's scale (rewards, horizon, how far off the critic is) decides the
        trade-off. 0 while the model is unknown."""
        if self._target_weight:
            return self._target_weight[0]
        if not self.noise.known:
            w = 0.0
        else:
            c = self.fresh_chain(0, max(int(round(self.mean_leaf_transitions)), 1))
            w = c.segments / c.targets if c.targets > 0 else 0.0
        self._target_weight.append(w)
        return w


@dataclass(frozen=True)
class Chain:
    """What a fresh chain of only children adds (:meth:`Calibration.fresh_chain`)."""

    #: Error variance of the refined value at its head.
    head_error: float
    #: Summed advantage error of its segments.
    segments: float
    #: Error variance of the plain backup (the critic target) at its head.
    head_target: float
    #: Summed critic-target error of its checkpoints (each with one child, weight 1).
    targets: float


#: One tree's share of a calibration's counts (:func:`tree_counts`): completion tokens,
#: segments, transitions to its valid leaves, valid leaves, bootstrapped leaves.
Counts = tuple[int, int, int, int, int]


def tree_counts(
    tree: Tree, truncation: Truncation = "bootstrap", keep: Callable[[Tree, Edge], bool] | None = None
) -> Counts:
    """One tree's :data:`Counts` (restricted to the segments ``keep`` accepts)."""
    edges = tree.edges.values()
    return edge_counts(tree, edges if keep is None else [e for e in edges if keep(tree, e)], truncation)


def edge_counts(tree: Tree, edges: Iterable[Edge], truncation: Truncation = "bootstrap") -> Counts:
    """The share of ``edges`` (some of ``tree``'s) in :func:`tree_counts`: integer sums,
    so a tree grown by grafting counts its old counts plus its new edges' share
    (``focus.search.grafting``: the new edges' children are new nodes, and an old
    edge's child keeps its kind)."""
    tokens = segments = leaf_transitions = leaves = boot = 0
    for e in edges:
        tokens += e.n_tokens
        segments += 1
        child = tree.nodes[e.child]
        if child.is_leaf and child.kind != "failed":
            leaf_transitions += child.transitions
            leaves += 1
            boot += child.kind == "truncated" and truncation == "bootstrap"
    return tokens, segments, leaf_transitions, leaves, boot


def calibrate(
    trees: Sequence[Tree],
    *,
    gamma: float = 1.0,
    truncation: Truncation = "bootstrap",
    keep: Callable[[Tree, Edge], bool] | None = None,
    counts: Sequence[Counts] | None = None,
    rows: Sequence[Sequence[Checkpoint]] | None = None,
) -> Calibration:
    """The :class:`Calibration` of ``trees`` (restricted to the segments ``keep`` accepts).
    ``counts`` and ``rows``: each tree's :func:`tree_counts` and noise rows
    (:func:`focus.noise_rows.tree_rows`) under the same ``keep``, if the caller keeps
    them per tree (integer counts and the same rows in the same order: the same fit)."""
    if counts is None:
        counts = [tree_counts(tree, truncation, keep) for tree in trees]
    tokens = sum(c[0] for c in counts)
    segments = sum(c[1] for c in counts)
    leaves = sum(c[3] for c in counts)
    boot = sum(c[4] for c in counts)
    return Calibration(
        noise_model(trees, gamma=gamma, truncation=truncation, keep=keep, rows=rows),
        tokens / segments if tokens else 1.0,
        mean_leaf_transitions(counts),
        gamma,
        boot / leaves if leaves else 0.0,
    )


def mean_leaf_transitions(counts: Sequence[Counts]) -> float:
    """:attr:`Calibration.mean_leaf_transitions` of trees with these :data:`Counts`."""
    leaf_transitions = sum(c[2] for c in counts)
    leaves = sum(c[3] for c in counts)
    return leaf_transitions / leaves if leaf_transitions else 1.0
