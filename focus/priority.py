"""Where search continues: search phases, and priorities over eligible checkpoints.

A search configuration is a :class:`Priority` carrying a list of :class:`Phase`; one
name holds for it everywhere: ``search`` (``Collector(search=...)``, the ``[search]``
config section, ``FocusConfig.build_search()``), with ``Priority`` the interface's. The
first phase may be an *evidence* phase (``rollouts_per_task`` complete rollouts from
each root); every other phase spends a task-transition budget in waves of
continuations from the checkpoints that rank highest.

A priority sees a small read-only :class:`NodeEvidence` view of one checkpoint - the
critic's prediction, the backed-up values of its children, the modelled variances of
one more continuation, depth, branches and influence - and returns a number; higher
is continued first. Collection-wide quantities the view depends on (the noise model,
the mean segment length) come from a :class:`Calibration`, which search refits when
the waves and the evidence have both doubled
(:meth:`focus.search.SearchState.calibration`). Planning itself (which jobs a wave
runs) is the pure function :func:`focus.search.plan_wave`.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from focus.draws import explore_draw
from focus.tree import Edge, Tree
from focus.weighting import Truncation, critic_weight

if TYPE_CHECKING:
    from focus.calibration import Calibration
    from focus.estimation import Estimator, NoiseModel, TreeValues

#: Names this module re-exports from :mod:`focus.calibration` (moved there), imported
#: when first asked for: the calibration's noise model needs numpy, and the pipeline's
#: configuration imports this module to validate a search (``focus --help`` loaded
#: numpy for it; tests/test_imports.py).
_MOVED = {"Calibration": "focus.calibration", "Chain": "focus.calibration", "calibrate": "focus.calibration"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Phase(BaseModel):
    """One search phase and its budgets.

    * ``rollouts_per_task``: makes this an evidence phase - that many complete rollouts
      from each task's root, in one wave. Only the first phase may be one.
    * ``transitions``: task-transition budget of a continuation phase, summed over all
      tasks. Waves stop launching once it is spent; rollouts already running finish,
      so the phase may end slightly over it (statistics report what was used).
    * ``wave_size``: how much a wave launches (re-ranked between waves), in the unit
      ``wave_unit`` names. ``"transitions"`` (the default): continuations until their
      expected task transitions reach ``wave_size`` continuations of average length,
      half a rollout each (half the calibration's mean transitions from the root to a
      valid leaf), so a wave of short continuations near the leaves holds more of them
      and a phase runs about as many waves whichever checkpoints its priority picks.
      ``"jobs"``: ``wave_size`` continuations, however short (every wave before issue 37).
    * ``max_branches``: most continuations started from one checkpoint (all phases).
    * ``max_depth``: deepest checkpoint continued (root = 0; 0 means root only).
    * ``max_waves``: most waves of a continuation phase (unset: until the budget is spent
      or nothing is eligible); refused with ``Execution(streaming=True)``, which has no
      waves to count.

    With ``Execution(streaming=True)`` a continuation phase has no wave barriers: the
    collector refills free slots as rollouts finish (a refill is capped by the free
    slots and by ``wave_size`` in its unit), so the model service never drains between
    waves, at the price of per-wave resume.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    rollouts_per_task: int | None = Field(None, ge=1)
    transitions: int | None = Field(None, ge=0)
    wave_size: int = Field(16, ge=1)
    wave_unit: Literal["transitions", "jobs"] = "transitions"
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


@dataclass(frozen=True, slots=True)
class NodeEvidence:
    """What a priority may read about one eligible checkpoint (read-only). Slotted: a
    ranking keeps one per checkpoint of every tree for the whole collection, and is
    never pickled."""

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
    #: Weight of V(n) in the advantages of the segments above it: tokens of the parent
    #: segment and of its siblings times the squared derivative of their advantage
    #: with respect to V(n), in units of the mean segment (see docs/algorithm.md).
    influence: float
    #: Expected task transitions of one more continuation from here.
    expected_transitions: float
    #: Tokens of the valid child segments, in units of the mean segment.
    child_tokens: float = 0.0
    #: Weight λ(n) of the critic's prediction in V(n).
    critic_weight: float = 0.0
    #: Modelled variance of one child's backed-up value around V(n): the true
    #: advantage of its action (``signal``) and the rest (``child_error``: the env's
    #: randomness and the error of the child's own value), scaled by how widely this
    #: node's children actually spread.
    signal: float = 0.0
    child_error: float = 0.0
    #: The critic's error variance t (infinite while the collection cannot tell it).
    critic_var: float = math.inf
    #: A fresh continuation's noise variance as a child (``fresh_error``) and the
    #: summed advantage error of the only-child segments below it (``chain_error``),
    #: see :meth:`Calibration.fresh_chain`.
    fresh_error: float = 0.0
    chain_error: float = 0.0
    #: Critic targets (plain backups Q̄, weight m): the mean variance of one valid
    #: child's plain backed-up value (``target_var``), a fresh continuation's
    #: (``fresh_target``), the summed target error of the checkpoints of its chain
    #: (``chain_target``), the weight of V(n)'s plain error in its parent's target
    #: (``γ^{2k}/m_p``, ``target_influence``), and what one unit of target error counts
    #: against one unit of advantage error (``Calibration.target_weight``).
    target_var: float = 0.0
    fresh_target: float = 0.0
    chain_target: float = 0.0
    target_influence: float = 0.0
    target_weight: float = 0.0
    #: Mean task transitions of a rollout from the root to a valid leaf (the
    #: calibration's), what sets :meth:`Selective.explore`'s rate per continuation slot.
    rollout_transitions: float = 1.0
    #: The part of a child's error variance its siblings share (issue 31 item 3): a
    #: bootstrapped leaf's critic error, which nearby states share, does not average
    #: away over more siblings. Counted once in V(n)'s error (not divided by n) and
    #: left out of ``child_error``; see :func:`shared_error`.
    shared_error: float = 0.0
    #: How much V(n) weighs in the advantages of the segments above it, in child
    #: segments (:func:`focus.estimation.value_influence`: the parent's valid children,
    #: its value taken as their plain mean), what λ weighs beside n's own children.
    value_influence: float = 0.0

    @classmethod
    def build(cls, **fields: Any) -> NodeEvidence:
        """``NodeEvidence(**fields)``, given every field by name: each slot set through its
        descriptor instead of a frozen dataclass's ``object.__setattr__`` per field
        (planning builds one view per changed checkpoint, 220,000 at 100k transitions over
        2,000 tasks). Anything else goes through ``__init__``."""
        if fields.keys() != _EVIDENCE_FIELDS:
            return cls(**fields)
        new = object.__new__(cls)
        for name, value in fields.items():
            _EVIDENCE_SET[name](new, value)
        return new

    def with_pending(self, pending: int) -> NodeEvidence:
        """This view with ``pending`` continuations planned: ``dataclasses.replace``
        without its field-by-field re-initialisation (the planner does this twice per
        job it plans; the class has no ``__post_init__`` to run)."""
        if type(self) is NodeEvidence:
            return _evidence_with_pending(self, pending)
        new = object.__new__(type(self))
        for get, put in _EVIDENCE_COPY:
            put(new, get(self))
        _EVIDENCE_SET["pending"](new, pending)
        return new


#: Every field of :class:`NodeEvidence` (:meth:`NodeEvidence.build`), and each slot's
#: setter and getter (its member descriptor's, which a frozen class's ``__setattr__``
#: does not guard).
_EVIDENCE_FIELDS = frozenset(f.name for f in dataclasses.fields(NodeEvidence))
_EVIDENCE_SET: dict[str, Any] = {name: NodeEvidence.__dict__[name].__set__ for name in _EVIDENCE_FIELDS}
_EVIDENCE_COPY = tuple((NodeEvidence.__dict__[n].__get__, _EVIDENCE_SET[n]) for n in sorted(_EVIDENCE_FIELDS))


def _evidence_functions() -> tuple[Callable[..., NodeEvidence], Callable[[NodeEvidence, int], NodeEvidence]]:
    """:func:`make_evidence` and the copy :meth:`NodeEvidence.with_pending` makes, written
    out field by field (as ``dataclasses`` writes an ``__init__``). Each fills a plain
    slotted twin of the class (the same slots, in the same order, so the same layout) by
    plain attribute stores, then makes it a :class:`NodeEvidence` by assigning its
    ``__class__``: a frozen class's stores go through its ``__setattr__``, and a slot's
    setter called per field (what this did before) took 3.0 µs a view against 1.1. A
    ranking builds a view per changed checkpoint and the planner copies one twice per
    job."""
    names = [f.name for f in dataclasses.fields(NodeEvidence)]
    twin = type("_EvidenceTwin", (), {"__slots__": NodeEvidence.__slots__})
    env: dict[str, Any] = {"_new": object.__new__, "_twin": twin, "_cls": NodeEvidence}
    make = [f"def make({', '.join(names)}):", "    new = _new(_twin)"]
    make += [f"    new.{n} = {n}" for n in names]
    copy = ["def copy(old, pending):", "    new = _new(_twin)"]
    copy += [f"    new.{n} = {'pending' if n == 'pending' else 'old.' + n}" for n in names]
    body = ["    new.__class__ = _cls", "    return new"]
    exec("\n".join([*make, *body, *copy, *body, ""]), env)  # noqa: S102 - fixed source
    return env["make"], env["copy"]


#: ``NodeEvidence(...)`` with every field given, by keyword or in field order
#: (:func:`_evidence_functions`; in field order for the views a ranking builds: a call
#: naming its 29 arguments took longer than the rest of the call, 2.7 µs against 0.15).
make_evidence, _evidence_with_pending = _evidence_functions()


class Priority(BaseModel, abc.ABC):
    """Ranks eligible checkpoints. Implement :meth:`__call__`; carries the search phases.

    ``kappa``, ``gamma`` and ``truncation`` refine values for ranking. Left ``None``
    they follow the estimator the collector is given (:meth:`resolved`), so one γ and
    one truncation rule hold for search and batch.

    A frozen pydantic model, like every built-in: a subclass's own parameters are
    annotated fields, set by keyword (``class Deep(Priority): weight: float = 1.0``,
    then ``Deep(weight=2.0, phases=...)``). Pydantic refuses ``self.weight = ...`` in an
    ``__init__`` (the instance is frozen) and ``weight = 1.0`` without an annotation.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    phases: tuple[Phase, ...] = (
        Phase("evidence", rollouts_per_task=4),
        Phase("continue", transitions=256, wave_size=16, max_branches=4, max_depth=8),
    )
    kappa: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    gamma: float | None = Field(None, ge=0.0, le=1.0)
    truncation: Truncation | None = None
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
        if not any(p.is_evidence or p.transitions for p in self.phases):
            raise ValueError(  # the collection ran and returned an empty batch without a word
                "the search's phases budget nothing (no evidence phase, and every continuation phase has transitions 0):"
                " its collections would be empty"
            )
        for i, p in enumerate(self.phases):
            if p.is_evidence and i > 0:
                raise ValueError(f"phase {p.name!r}: only the first phase may be an evidence phase (rollouts_per_task)")
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"phase names must be unique, got {names}")
        return self

    @property
    def discount(self) -> float:
        return 1.0 if self.gamma is None else self.gamma

    @property
    def truncation_rule(self) -> Truncation:
        return "bootstrap" if self.truncation is None else self.truncation

    def resolved(self, estimator: Estimator) -> Priority:
        """This search with the fields left ``None`` taken from ``estimator``; a γ or
        truncation rule that differs from the estimator's is refused."""
        for name in ("gamma", "truncation"):
            mine, theirs = getattr(self, name), getattr(estimator, name)
            if mine is not None and mine != theirs:
                raise ValueError(
                    f"the search's {name} ({mine!r}) differs from the estimator's ({theirs!r}): "
                    f"leave the search's unset, one {name} holds for search and batch"
                )
        update = {k: getattr(estimator, k) for k in ("kappa", "gamma", "truncation") if getattr(self, k) is None}
        return self.model_copy(update=update) if update else self

    def values(self, tree: Tree, noise: NoiseModel | None = None) -> TreeValues:
        """Refined values the ranking reads."""
        from focus.estimation import tree_values

        return tree_values(tree, gamma=self.discount, kappa=self.kappa, noise=noise, truncation=self.truncation_rule)

    def calibrate(
        self, trees: Sequence[Tree], keep: Callable[[Tree, Edge], bool] | None = None, **parts: Any
    ) -> Calibration:
        """:func:`focus.calibration.calibrate` under this search's γ and truncation rule;
        ``parts``: its per-tree ``counts`` and ``rows``, if known."""
        from focus.calibration import calibrate

        return calibrate(trees, gamma=self.discount, truncation=self.truncation_rule, keep=keep, **parts)

    def wave_share(self, branched: bool) -> float:
        """The most of what is left of a continuation phase's budget one wave may plan:
        ``branched`` is False while no continuation wave has been grafted and the
        evidence has no checkpoint with two valid children (the noise model is the
        unbranched rollouts'). 1 (every priority of the library): a wave is limited by
        ``Phase.wave_size`` alone. A benchmark-only hedge keeps part of the budget for a
        fit on spreads (``benchmarks.hedges``, docs/findings/estimator-allocation.md,
        "The first wave")."""
        return 1.0

    @abc.abstractmethod
    def __call__(self, node: NodeEvidence) -> float:
        """Score of continuing ``node`` once more; higher first."""

    def depth_share_bound(self) -> float:
        """The most a continuation phase's checkpoints of one depth may take of its
        continuations, relative to uniform branching's share for that depth
        (:class:`focus.search.depth_share.DepthShare`); 0: no bound (uniform branching's,
        which needs none)."""
        return 0.0


class Uniform(Priority):
    """Every eligible checkpoint is equally good: continuations spread at random
    (ties are broken by a seeded hash), the uniform-branching baseline."""

    def __call__(self, node: NodeEvidence) -> float:
        return 1.0


class Selective(Priority):
    """Expected reduction of the batch's error per transition from one more
    continuation (docs/algorithm.md, "Priorities").

    With ``n = m + pending`` children alike (one child's backed-up value has variance
    ``a`` from its action's true advantage and ``E`` from everything else), a child
    segment's advantage error is

        MSE(n) = E·(1 − 2μ/n + μ²/n) + μ²·a/n + λ²·t,      μ = 1 − λ,

    and V(n)'s own error ``Err(n) = λ²t + μ²(a + E)/n``, with λ the estimator's weight
    for n children. One more continuation changes the n existing child segments from
    MSE(n) to MSE(n+1), adds a new child segment (its E that of a fresh rollout) and
    the only-child segments below it, and changes the segments above n by
    ``influence·(Err(n+1) − Err(n))``; with ``targets``, the change of the critic
    targets' error (:meth:`target_change`) counts too, weighted by
    :attr:`Calibration.target_weight`. The priority is minus that total change, per
    expected task transition. Where the env's randomness E dominates the advantages
    a, a child segment's error grows with more siblings (its advantage stops being
    shrunk to zero and carries its own outcome noise), so such checkpoints rank low:
    branching there cannot reduce the error.
    """

    use_influence: bool = True
    #: Count the critic targets' error beside the advantages' (issue 12 item 3: budget
    #: goes where a continuation reduces both), each relative to its level along an
    #: unbranched rollout (:attr:`Calibration.target_weight`).
    targets: bool = True
    #: Rank by reduction per expected task transition (the budget's unit), so a
    #: continuation near the leaves, which is cheap, is not ranked like a full rollout.
    per_transition: bool = True
    #: Share of continuations placed independently of the critic and of every outcome
    #: seen (issue 31): each continuation slot (checkpoint, branch index) is drawn for
    #: exploration by a fixed hash with probability ``explore / (1 + L̄)``, L̄ the mean
    #: transitions of a rollout (a rollout of L̄ transitions opens about L̄ + 1 new slots:
    #: one per checkpoint it creates, and the next branch of the one it left), and a
    #: drawn slot ranks above every other. About that share of all continuations is
    #: then uniform over checkpoints, wherever the critic looks right, so the spreads and
    #: misses the noise model reads are not only those the ranking chose. Measured:
    #: docs/algorithm.md, "Exploration share".
    explore: float = Field(0.25, ge=0.0, le=1.0)
    #: Bound on the ranking's concentration (issue 31, mechanism 3): the continuations
    #: a phase starts at one depth stay at most ``depth_share`` times that depth's share
    #: of the eligible checkpoints (uniform branching's share), plus one, of the phase's
    #: continuations so far; the planner leaves a checkpoint of a full depth out of the
    #: wave (:class:`focus.search.depth_share.DepthShare`). 3 (the default) bounds the
    #: worst cases measured on families made outside the project (cells above 1.1x
    #: uniform's error 44 -> 13 over five sets) at a cost to the project's own gain
    #: (its noisy critics' median batch ratio 0.885 -> 0.948 at 2H + 6H); 0: no bound
    #: (docs/algorithm.md, "Depth share").
    depth_share: float = Field(3.0, ge=0.0)

    def depth_share_bound(self) -> float:
        return self.depth_share

    def weight(self, node: NodeEvidence, m: int) -> float:
        """λ the estimator would give n with ``m`` like children
        (:func:`focus.weighting.critic_weight`, with n's ``value_influence``)."""
        if node.value is None or m <= 0:
            return 0.0
        if self.kappa is not None:
            return self.kappa / (self.kappa + m) if self.kappa > 0 else 0.0
        t = node.critic_var
        if not math.isfinite(t):
            return 0.0
        return critic_weight(node.signal / m, (node.signal + node.child_error) / m, t, node.value_influence / m)

    def error(self, node: NodeEvidence, m: int) -> float:
        """Modelled error variance of V(n) with ``m`` like children."""
        return self._error(node, m, self.weight(node, m) if m > 0 else 0.0)

    def _error(self, node: NodeEvidence, m: int, lam: float) -> float:
        """:meth:`error` with λ = ``self.weight(node, m)`` given (read only for m > 0)."""
        t = node.critic_var if math.isfinite(node.critic_var) else 0.0
        v = node.signal + node.child_error
        if m <= 0:
            return t if node.value is not None and math.isfinite(node.critic_var) else v
        return (lam * lam * t if lam > 0 else 0.0) + (1.0 - lam) ** 2 * (v / m + node.shared_error)

    def segment_error(self, node: NodeEvidence, m: int, noise: float) -> float:
        """Advantage error of one of ``m`` child segments whose child has noise ``noise``."""
        return self._segment_error(node, m, noise, self.weight(node, m))

    def _segment_error(self, node: NodeEvidence, m: int, noise: float, lam: float) -> float:
        """:meth:`segment_error` with λ = ``self.weight(node, m)`` given."""
        t = node.critic_var if math.isfinite(node.critic_var) else 0.0
        mu = 1.0 - lam
        own = noise * (1 - 2 * mu / m + mu * mu / m) + mu * mu * node.signal / m
        return own + (lam * lam * (t + node.shared_error) if lam > 0 else 0.0)

    def __call__(self, node: NodeEvidence) -> float:
        slot = node.branches + node.pending
        if self.explore > 0 and slot >= 1:
            rate = self.explore / (1.0 + max(node.rollout_transitions, 0.0))
            if explores(node.tree_index, node.node_id, slot, rate):
                return EXPLORE
        if not math.isfinite(node.critic_var):
            # the model is unknown (no critic residual and no spread yet): nothing tells
            # outcome noise from critic error, so nothing ranks one checkpoint above
            # another (ties are broken by the seeded hash, as for Uniform)
            return 0.0
        n = node.m + node.pending
        e = node.child_error
        if type(self).segment_error is not _SEGMENT_ERROR or type(self).error is not _ERROR:
            return self._generic(node, n, e)
        return self._score(node, n, e)

    def _score(self, node: NodeEvidence, n: int, e: float) -> float:
        """:meth:`__call__`'s score with :meth:`weight`, :meth:`_error` and
        :meth:`_segment_error` written out (the same operations in the same order, each
        λ computed once; the critic's variance is finite here): a ranking rebuild scores
        about 100,000 views at 100k transitions over 2,000 tasks, and the eight calls per
        view took half of the score's time (tests/test_fast_paths.py holds it to the
        calls)."""
        t = node.critic_var
        signal, shared = node.signal, node.shared_error
        v = signal + e
        kappa = self.kappa
        if node.value is None:
            before = after = 0.0
        elif kappa is not None:
            after = kappa / (kappa + (n + 1)) if kappa > 0 else 0.0
            before = (kappa / (kappa + n) if kappa > 0 else 0.0) if n > 0 else 0.0
        else:
            after = critic_weight(signal / (n + 1), v / (n + 1), t, node.value_influence / (n + 1))
            before = critic_weight(signal / n, v / n, t, node.value_influence / n) if n > 0 else 0.0
        # the new segments' own errors
        m = n + 1
        mu = 1.0 - after
        noise = node.fresh_error
        own = noise * (1 - 2 * mu / m + mu * mu / m) + mu * mu * signal / m
        change = own + (after * after * (t + shared) if after > 0 else 0.0) + node.chain_error
        if n:
            per_child = node.child_tokens / node.m if node.m else 1.0
            own = e * (1 - 2 * mu / m + mu * mu / m) + mu * mu * signal / m
            seg_after = own + (after * after * (t + shared) if after > 0 else 0.0)
            mu_b = 1.0 - before
            own = e * (1 - 2 * mu_b / n + mu_b * mu_b / n) + mu_b * mu_b * signal / n
            seg_before = own + (before * before * (t + shared) if before > 0 else 0.0)
            change += n * per_child * (seg_after - seg_before)
        if self.use_influence:
            err_after = (after * after * t if after > 0 else 0.0) + (1.0 - after) ** 2 * (v / m + shared)
            if n <= 0:
                err_before = t if node.value is not None else v
            else:
                err_before = (before * before * t if before > 0 else 0.0) + (1.0 - before) ** 2 * (v / n + shared)
            change += node.influence * (err_after - err_before)
        if self.targets:
            change += node.target_weight * self.target_change(node)
        cost = node.expected_transitions if self.per_transition else 1.0
        return -change / cost

    def _generic(self, node: NodeEvidence, n: int, e: float) -> float:
        """:meth:`__call__`'s score through the public error terms, for a subclass that
        overrides :meth:`segment_error` or :meth:`error`."""
        change = self.segment_error(node, n + 1, node.fresh_error) + node.chain_error
        if n:
            per_child = node.child_tokens / node.m if node.m else 1.0
            change += n * per_child * (self.segment_error(node, n + 1, e) - self.segment_error(node, n, e))
        if self.use_influence:
            change += node.influence * (self.error(node, n + 1) - self.error(node, n))
        if self.targets:
            change += node.target_weight * self.target_change(node)
        cost = node.expected_transitions if self.per_transition else 1.0
        return -change / cost

    def target_change(self, node: NodeEvidence) -> float:
        """Change of the summed critic-target error (each checkpoint's plain backup Q̄
        against the true value, weighted by its m) from one more continuation.

        A checkpoint with children of plain variances v_j counts ``m·Var(Q̄) = Σ_j v_j/m``:
        the new child (a fresh rollout, ``fresh_target``) moves n's from the mean of its
        m valid (variance ``target_var``) and pending (fresh) children to the mean with
        one more fresh one; the fresh chain adds its checkpoints' own one-rollout
        targets; and Q̄(n)'s error ``Σ_j v_j/m²`` enters its parent's by
        ``target_influence``."""
        m, p = node.m, node.pending
        v, f = node.target_var, node.fresh_target
        total = m * v + p * f
        n = m + p
        own = (total + f) / (n + 1) - (total / n if n else 0.0)
        before = total / (n * n) if n else (node.critic_var if math.isfinite(node.critic_var) else f)
        upper = node.target_influence * ((total + f) / ((n + 1) * (n + 1)) - before)
        return own + node.chain_target + upper


_SEGMENT_ERROR, _ERROR = Selective.segment_error, Selective.error

#: The score of a continuation slot drawn for exploration: above any other (ties among
#: them go by the ranking's seeded tie-break, so their order is random too).
EXPLORE = 1e300


def exploration_rate(search: Priority, rollout_transitions: float) -> float:
    """The rate at which ``search`` draws a continuation slot for exploration
    (:func:`explores`) when a rollout takes ``rollout_transitions`` (the calibration's
    :attr:`~Calibration.mean_leaf_transitions`). A drawn slot (of index 1 or more)
    scores :data:`EXPLORE` whatever else the calibration says, so a planner can take
    the drawn slots before it fits the noise model and ranks any tree
    (``focus.search.planning``). 0 where the priority draws none, or where its score
    is not :class:`Selective`'s own (a subclass with its own ``__call__``)."""
    if type(search).__call__ is not Selective.__call__:
        return 0.0
    explore = search.explore  # type: ignore[attr-defined]
    return explore / (1.0 + max(rollout_transitions, 0.0)) if explore > 0 else 0.0


def explores(tree_index: int, node_id: int, branch: int, rate: float) -> bool:
    """Whether continuation slot ``branch`` of checkpoint ``node_id`` of tree
    ``tree_index`` is drawn for exploration at ``rate``: a fixed hash of the slot, so
    the draw depends on nothing the collection has seen (the same on every machine)."""
    return rate > 0 and explore_draw(tree_index, node_id, branch) < rate
