"""Where search continues: search phases, and priorities over eligible checkpoints.

A search configuration is a :class:`Priority` carrying a list of :class:`Phase`. The
first phase may be an *evidence* phase (``rollouts_per_task`` complete rollouts from
each root); every other phase spends a task-transition budget in waves of
continuations from the checkpoints that rank highest.

A priority sees a small read-only :class:`NodeEvidence` view of one checkpoint - the
critic's prediction, the backed-up values of its children, depth, branches and
influence - and returns a number; higher is continued first. Planning itself (which
jobs a wave runs) is the pure function :func:`focus.search.plan_wave`.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from focus.estimation import TreeValues, node_kappa, tree_values
from focus.tree import Tree


class Phase(BaseModel):
    """One search phase and its budgets.

    * ``rollouts_per_task``: makes this an evidence phase - that many complete rollouts
      from each task's root, in one wave. Only the first phase may be one.
    * ``transitions``: task-transition budget of a continuation phase, summed over all
      tasks. Waves stop launching once it is spent; rollouts already running finish,
      so the phase may end slightly over it (statistics report what was used).
    * ``wave_size``: continuations launched per wave (re-ranked between waves).
    * ``max_branches``: most continuations started from one checkpoint (all phases).
    * ``max_depth``: deepest checkpoint continued (root = 0; 0 means root only).

    With ``Execution(streaming=True)`` a continuation phase has no wave barriers: the
    collector refills free slots as rollouts finish (``wave_size`` is then unused), so
    the model service never drains between waves, at the price of per-wave resume.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    rollouts_per_task: int | None = Field(None, ge=1)
    transitions: int | None = Field(None, ge=0)
    wave_size: int = Field(16, ge=1)
    max_branches: int = Field(4, ge=1)
    max_depth: int = Field(64, ge=0)
    max_waves: int | None = Field(None, ge=1)

    def __init__(self, name: str | None = None, /, **data: object) -> None:
        if name is not None:
            data["name"] = name
        super().__init__(**data)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _one_kind(self) -> Phase:
        if self.rollouts_per_task is None and self.transitions is None:
            raise ValueError(
                f"phase {self.name!r} needs rollouts_per_task (an evidence phase) or transitions (a continuation budget)"
            )
        if self.rollouts_per_task is not None and self.transitions is not None:
            raise ValueError(f"phase {self.name!r} sets both rollouts_per_task and transitions; choose one")
        return self

    @property
    def is_evidence(self) -> bool:
        return self.rollouts_per_task is not None


@dataclass(frozen=True)
class NodeEvidence:
    """What a priority may read about one eligible checkpoint (read-only)."""

    tree_index: int
    node_id: int
    depth: int
    #: Task transitions from the root to this checkpoint.
    transitions: int
    #: Critic prediction v̂(n) and its uncertainty, when scored.
    value: float | None
    value_std: float | None
    #: Refined value V(n) and mean backed-up child value Q̄(n) (None without children).
    refined: float | None
    q_bar: float | None
    #: Backed-up values r(e) + γ^k V(c) of the valid children.
    child_values: tuple[float, ...]
    #: Valid children m(n); all continuations started (failed included); planned in this wave.
    m: int
    branches: int
    pending: int
    #: Weight of V(n) in the batch: tokens of the advantages and targets that use it,
    #: propagated from the ancestors whose values back it up (see docs/algorithm.md).
    influence: float
    #: Expected task transitions of one more continuation from here.
    expected_transitions: float


class Priority(BaseModel, abc.ABC):
    """Ranks eligible checkpoints. Implement :meth:`__call__`; carries the search phases."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    phases: tuple[Phase, ...] = (
        Phase("evidence", rollouts_per_task=4),
        Phase("continue", transitions=256, wave_size=16, max_branches=4, max_depth=8),
    )
    #: κ and γ used to refine values for ranking (independent of the estimator's).
    kappa: float = Field(1.0, ge=0.0)
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    #: Waves of a continuation phase planned and running at once. 1: each wave is
    #: planned after the previous one is grafted and scored (a barrier). 2 or more: the
    #: next wave is planned while the previous ones still run, counting their jobs as
    #: pending, and launches at once, so the model service does not drain while a wave's
    #: slowest rollouts finish and the next one is planned (:func:`focus.search.plan_ahead`).
    #: Plans are still a pure function of the grafted rollouts, so a collection stays
    #: reproducible and resumable per wave; what it plans differs from 1's.
    waves_in_flight: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check_phases(self) -> Priority:
        if not self.phases:
            raise ValueError("a search needs at least one phase")
        for i, p in enumerate(self.phases):
            if p.is_evidence and i > 0:
                raise ValueError(f"phase {p.name!r}: only the first phase may be an evidence phase (rollouts_per_task)")
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        return self

    def values(self, tree: Tree) -> TreeValues:
        """Refined values the ranking reads (the estimator computes its own)."""
        return tree_values(tree, gamma=self.gamma, kappa=self.kappa)

    @abc.abstractmethod
    def __call__(self, node: NodeEvidence) -> float:
        """Score of continuing ``node`` once more; higher first."""


class Uniform(Priority):
    """Every eligible checkpoint is equally good: continuations spread at random
    (ties are broken by a seeded hash), the uniform-branching baseline."""

    def __call__(self, node: NodeEvidence) -> float:
        return 1.0


class Selective(Priority):
    """Expected reduction in critic error from one more continuation.

    ``priority(n) = σ̂²(n) · [1/(κ+m) − 1/(κ+m+1)] · influence(n)`` with ``m`` counting
    planned continuations too, and ``σ̂²`` a blend of the prior ``(V−lo)(hi−V)``
    (weight ``prior_weight`` pseudo-children), the spread of the children's backed-up
    values (weight m − 1) and the critic's disagreement beyond sampling noise,
    ``max(0, (v̂ − Q̄)² − s²/m)`` (times ``disagreement_weight``).
    """

    reward_range: tuple[float, float] = (0.0, 1.0)
    prior_weight: float = Field(1.0, ge=0.0)
    disagreement_weight: float = Field(1.0, ge=0.0)
    use_influence: bool = True
    #: Rank by reduction per expected task transition (the budget's unit), so a
    #: continuation near the leaves, which is cheap, is not ranked like a full rollout.
    per_transition: bool = True
    #: κ(n) from a reported critic uncertainty, as in the estimator.
    adaptive_kappa: bool = False
    return_variance: float = Field(0.25, gt=0.0)
    kappa_max: float = Field(1e4, gt=0.0)

    def values(self, tree: Tree) -> TreeValues:
        kappa = (
            node_kappa(tree, self.kappa, self.return_variance, self.kappa_max) if self.adaptive_kappa else self.kappa
        )
        return tree_values(tree, gamma=self.gamma, kappa=kappa)

    def node_kappa(self, node: NodeEvidence) -> float:
        if node.value is None:
            return 0.0
        s = node.value_std
        if not self.adaptive_kappa or s is None:
            return self.kappa
        return self.kappa_max if s <= 0 else min(self.kappa_max, self.return_variance / (s * s))

    def variance(self, node: NodeEvidence) -> float:
        lo, hi = self.reward_range
        centre = node.refined if node.refined is not None else node.value
        v = (lo + hi) / 2 if centre is None else min(max(centre, lo), hi)
        prior = (v - lo) * (hi - v)
        qs = node.child_values
        m = len(qs)
        s2 = 0.0
        if m >= 2:
            mean = sum(qs) / m
            s2 = sum((q - mean) ** 2 for q in qs) / (m - 1)
        denom = self.prior_weight + max(m - 1, 0)
        spread = (self.prior_weight * prior + max(m - 1, 0) * s2) / denom if denom > 0 else prior
        dis = 0.0
        if node.value is not None and node.q_bar is not None and m:
            # (v̂ − Q̄)² overstates the critic's error by the sampling variance of Q̄
            dis = max(0.0, (node.value - node.q_bar) ** 2 - spread / m)
        return spread + self.disagreement_weight * dis

    def __call__(self, node: NodeEvidence) -> float:
        k = self.node_kappa(node)
        n = node.m + node.pending
        gain = (1.0 / (k + n) if k + n > 0 else 1.0) - 1.0 / (k + n + 1)
        infl = node.influence if self.use_influence else 1.0
        cost = node.expected_transitions if self.per_transition else 1.0
        return self.variance(node) * gain * infl / cost


def expected_lengths(tree: Tree) -> dict[int, float]:
    """Expected task transitions from each checkpoint to a leaf, backed up through children."""
    return _expected_lengths(tree, {i: e.k for i, e in tree.edges.items()})


def _expected_lengths(tree: Tree, k: dict[int, int]) -> dict[int, float]:
    out: dict[int, float] = {}
    edges = tree.edges
    for node in tree.postorder():
        if node.is_leaf:
            out[node.id] = 0.0
            continue
        ch = node.children
        out[node.id] = sum(k[e] + out[edges[e].child] for e in ch) / len(ch) if ch else math.nan
    return out


def node_evidence(
    tree: Tree, tree_index: int, values: TreeValues, pending: dict[int, int] | None = None
) -> dict[int, NodeEvidence]:
    """Evidence views of every checkpoint of ``tree``.

    Influence: V(n) enters the advantage of its parent segment and of each child
    segment, and its own critic target; through the backup it also moves every
    ancestor's value with coefficient ``γ^k/(κ+m)`` per level, so ancestors' direct
    uses count with that coefficient squared. Segment uses are weighted by tokens
    relative to the tree's mean segment, the target counts 1.
    """
    pending = pending or {}
    # Segment facts once per call: every pass below reads them again.
    tokens = {i: e.n_tokens for i, e in tree.edges.items()}
    mean_tokens = (sum(tokens.values()) / len(tokens)) if tokens else 1.0
    mean_tokens = mean_tokens or 1.0
    k = {i: e.k for i, e in tree.edges.items()}
    lengths = _expected_lengths(tree, k)
    leaves = [n for n in tree.leaves() if n.kind != "failed"]
    default_len = (sum(n.transitions for n in leaves) / len(leaves)) if leaves else 1.0
    direct: dict[int, float] = {}
    for node in tree.checkpoints():
        own = 1.0
        if node.parent_edge is not None:
            own += tokens[node.parent_edge] / mean_tokens
        own += sum(tokens[e] for e in node.children) / mean_tokens
        direct[node.id] = own
    influence: dict[int, float] = {}
    for i in sorted(direct):
        node = tree.nodes[i]
        infl = direct[i]
        if node.parent_edge is not None:
            e = tree.edges[node.parent_edge]
            mp = values.m.get(e.parent, 0)
            kp = values.kappa.get(e.parent, 0.0) if node.value is not None else 0.0
            coef = values.gamma ** k[e.id] / (kp + mp) if kp + mp > 0 else 0.0
            infl += coef * coef * influence[e.parent]
        influence[i] = infl
    out: dict[int, NodeEvidence] = {}
    for node in tree.checkpoints():
        i = node.id
        exp_len = lengths[i]
        if math.isnan(exp_len):
            exp_len = max(1.0, default_len - node.transitions)
        out[i] = NodeEvidence(
            tree_index=tree_index,
            node_id=i,
            depth=node.depth,
            transitions=node.transitions,
            value=node.value,
            value_std=node.value_std,
            refined=values.value.get(i),
            q_bar=values.q_bar.get(i),
            child_values=values.child_q.get(i, ()),
            m=values.m.get(i, 0),
            branches=len(node.children),
            pending=pending.get(i, 0),
            influence=influence[i],
            expected_transitions=max(exp_len, 1.0),
        )
    return out
