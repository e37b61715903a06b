"""Refined values backed up through children (``docs/algorithm.md``, "Refined values").

``V(n) = λ(n)·v̂(n) + (1 − λ(n))·Q̄(n)`` with the critic's weight λ(n) from the noise
model (:mod:`focus.noise`) or a fixed κ. :func:`refine` is the per-checkpoint step the
batch and search's incremental rankings share; :func:`tree_values` backs a whole tree up.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from focus.noise import NoiseModel, Truncation, leaf_value, noise_model
from focus.segments import Segment, segment
from focus.sums import left_sum
from focus.tree import Node, Tree
from focus.weighting import checkpoint_critic_error
from focus.weighting import critic_weight as critic_weight  # re-exported: moved there


@dataclass(frozen=True)
class TreeValues:
    """Per-node statistics of one tree that estimators read (all keyed by node id).

    ``value`` is ``None`` where nothing can be known: failed leaves, truncated leaves
    without a critic prediction, and checkpoints with no valid continuation and no
    prediction. Segments touching such a node get no advantage.
    """

    gamma: float
    #: Weight λ(n) of the critic's prediction in each node's refined value.
    critic_weight: Mapping[int, float]
    kind: Mapping[int, str]
    v_hat: Mapping[int, float | None]
    #: Refined value V(n).
    value: Mapping[int, float | None]
    #: Modelled error variance of V(n) as an estimate of the true value.
    error: Mapping[int, float]
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
    leaf_returns: Sequence[float]
    #: Noise model the critic weights came from (None with a fixed κ).
    noise: NoiseModel | None = None
    #: Modelled error variance of the plain backup (λ = 0: the critic target Q̄(n)),
    #: the critic's error at a checkpoint without children and at a bootstrapped leaf.
    plain_error: Mapping[int, float] = field(default_factory=dict)
    #: The segments the values were backed up over, by edge id (:func:`segment` at
    #: ``gamma``; empty where the values were not built by :func:`tree_values`): what
    #: an estimator's advantages read of each edge, computed once.
    segments: Mapping[int, Segment] = field(default_factory=dict)

    @property
    def kappa(self) -> dict[int, float]:
        """The same weights as pseudo-counts: ``λ = κ/(κ + m)``, so ``κ = m·λ/(1 − λ)``."""
        out = {}
        for i, lam in self.critic_weight.items():
            m = self.m.get(i, 0)
            out[i] = math.inf if lam >= 1.0 else m * lam / (1.0 - lam)
        return out


def child_variances(w1: float, disc: float, child_error: float, step: float, action: float) -> tuple[float, float]:
    """(signal, noise) variance of one child's backed-up value ``r + γ^k V(c)`` around
    the parent's true value, with ``step`` and ``action`` the noise model's step and
    action variances at the parent's depth: ``signal`` is its first action's true
    advantage, ``noise`` everything else (the env's randomness on that transition, the
    segment's later transitions, and the error of V(c))."""
    signal = action * min(w1, 1.0)
    return signal, step * w1 - signal + disc * disc * child_error


@dataclass(frozen=True)
class Refined:
    """What :func:`refine` computes for one checkpoint from its children."""

    value: float | None
    weight: float
    error: float
    q_bar: float | None
    qs: tuple[float, ...]
    #: Summed per-child variances (signal, noise), see :func:`child_variances`.
    signal: float
    noise: float
    #: Error variance of the plain backup Q̄ (λ = 0), what a critic target carries.
    plain_error: float = 0.0


_new = object.__new__
_set = object.__setattr__


def _refined(
    value: float | None,
    weight: float,
    error: float,
    q_bar: float | None,
    qs: tuple[float, ...],
    signal: float,
    noise: float,
    plain_error: float,
) -> Refined:
    """``Refined(...)`` without the frozen dataclass's ``__init__`` (its fields straight
    into the new instance's ``__dict__``; the class has no ``__post_init__``): one is made
    per node and per refinement, in search's rankings and in every batch's backups
    (about 190,000 at 40k transitions), and a frozen ``__init__`` sets each of its 8
    fields through ``object.__setattr__``, twice the time of the rest of the call."""
    r = _new(Refined)
    _set(
        r,
        "__dict__",
        {
            "value": value,
            "weight": weight,
            "error": error,
            "q_bar": q_bar,
            "qs": qs,
            "signal": signal,
            "noise": noise,
            "plain_error": plain_error,
        },
    )
    return r


def value_influence(discount: float, m_parent: int) -> float:
    """How much a checkpoint's value V(c) weighs in the advantages of the segments
    above it, in child segments: ``γ^{2k}·(m_p − 1)/m_p`` for a checkpoint whose parent
    segment has discount ``γ^k`` and whose parent has ``m_p`` valid children, taking the
    parent's value as their plain mean (λ_p = 0). V(c) enters its parent segment's
    advantage ``r + γ^k V(c) − V(p)`` by ``γ^k(1 − 1/m_p)`` and each sibling's by
    ``γ^k/m_p``; the squares sum to the above. An only child's change cancels (0).
    The parent's own λ is left out so that the weight is known when V(c) is computed
    (it depends on the tree's shape, not on values computed after c's)."""
    return discount * discount * (m_parent - 1) / m_parent if m_parent >= 2 else 0.0


def refine(
    v_hat: float | None,
    children: Iterable[
        tuple[float, float, float | None, float, float] | tuple[float, float, float | None, float, float, float]
    ],
    noise: NoiseModel,
    depth: int,
    kappa: float | None,
    influence: float = 0.0,
) -> Refined:
    """Refined value of one checkpoint from its children's
    ``(discounted reward, γ^k, child value, child error variance, first-step weight[,
    child plain-backup error variance])`` (the last defaults to the child's error).

    With a fixed ``kappa`` the weight is ``κ/(κ + m)``. Otherwise (``kappa=None``) it
    is the weight that minimises the advantage error of the child segments and, by
    ``influence`` (:func:`value_influence`), of the segments above that V(n) enters:
    :func:`critic_weight` with ``T = Σ_j signal_j / m²`` the variance of the mean true
    advantage of the sampled actions, ``Var(Q̄) = Σ_j (signal_j + noise_j) / m²``, t the
    critic's error variance and ``ι = influence / m`` (docs/algorithm.md derives it).
    One function for the batch and for search, so both compute the same numbers in the
    same order.
    """
    qs: list[float] = []
    signal = rest = plain = 0.0
    step, action = noise.step_var(depth), noise.action_var(depth)
    for dr, disc, vc, errc, w1, *more in children:
        if vc is None:
            continue
        qs.append(dr + disc * vc)
        sig, nz = child_variances(w1, disc, errc, step, action)
        signal += sig
        rest += nz
        plain += step * w1 + disc * disc * (more[0] if more else errc)
    return _backed_up(v_hat, qs, signal, rest, plain, noise, depth, kappa, influence)


#: :class:`Refined`'s fields in field order, as a tuple (what the per-node steps of a
#: backup and of search's rankings read: made per node, a tuple costs a fifth of a
#: ``Refined``).
Terms = tuple[float | None, float, float, float | None, tuple[float, ...], float, float, float]


def _backed_up(
    v_hat: float | None,
    qs: list[float],
    signal: float,
    rest: float,
    plain: float,
    noise: NoiseModel,
    depth: int,
    kappa: float | None,
    influence: float,
    t: float | None = None,
) -> Refined:
    """:func:`refine` from its children's sums: the valid children's backed-up values
    ``qs`` and their summed signal, noise and plain-backup variances; ``t``:
    ``noise.critic_error_at(depth)``, if known."""
    return _refined(*_backed_up_terms(v_hat, qs, signal, rest, plain, noise, depth, kappa, influence, t))


def _backed_up_terms(
    v_hat: float | None,
    qs: list[float],
    signal: float,
    rest: float,
    plain: float,
    noise: NoiseModel,
    depth: int,
    kappa: float | None,
    influence: float,
    t: float | None = None,
) -> Terms:
    """:func:`_backed_up`'s fields as a tuple (:data:`Terms`)."""
    m = len(qs)
    if t is None:
        t = noise.critic_error_at(depth)
    if not m:
        return (v_hat, 1.0, t, None, (), 0.0, 0.0, t)
    q_bar = left_sum(qs) / m
    var_q = (signal + rest) / (m * m)
    if v_hat is None:
        lam = 0.0
        value = q_bar
    elif kappa is not None:
        lam = kappa / (kappa + m) if kappa > 0 else 0.0
        # (the arithmetic of the fixed-κ formula as it always was: same bits)
        value = q_bar if kappa <= 0 else (kappa * v_hat + m * left_sum(qs) / m) / (kappa + m)
    elif noise.known:
        # the depth's t, unless this checkpoint's own miss says the critic is wrong here
        miss = v_hat - q_bar
        if m >= 2 and miss * miss > t + var_q:  # (the test's own first condition, without a call)
            t = checkpoint_critic_error(v_hat, qs, q_bar, var_q, t)
        lam = critic_weight(signal / (m * m), var_q, t, influence / m)
        value = q_bar if lam <= 0.0 else lam * v_hat + (1.0 - lam) * q_bar
    else:
        lam = 0.0
        value = q_bar
    error = (lam * lam * t if lam > 0 else 0.0) + (1.0 - lam) ** 2 * var_q
    return (value, lam, error, q_bar, tuple(qs), signal, rest, plain / (m * m))


def node_value(
    node: Node,
    segments: Mapping[int, Segment],
    value: Mapping[int, float | None],
    error: Mapping[int, float],
    noise: NoiseModel,
    kappa: float | None,
    truncation: Truncation,
    plain: Mapping[int, float],
    influence: float = 0.0,
) -> Refined:
    """One node's refined value from its children's (children first): the per-node step
    of :func:`tree_values`, shared with search's incremental rankings so both compute
    the same numbers in the same order. ``plain`` holds the children's plain-backup
    errors (:attr:`Refined.plain_error`); ``influence`` is :func:`value_influence`."""
    return _refined(*node_terms(node, segments, value, error, noise, kappa, truncation, plain, influence))


def node_terms(
    node: Node,
    segments: Mapping[int, Segment],
    value: Mapping[int, float | None],
    error: Mapping[int, float],
    noise: NoiseModel,
    kappa: float | None,
    truncation: Truncation,
    plain: Mapping[int, float],
    influence: float = 0.0,
) -> Terms:
    """:func:`node_value`'s fields as a tuple (:data:`Terms`): value, weight, error,
    Q̄, child values, signal, noise, plain error."""
    if node.is_leaf:
        v, err = leaf_value(node.kind, node.value, truncation, noise.critic_error_at(node.depth))
        return (v, 1.0, err, None, (), 0.0, 0.0, err)
    # refine's loop over (reward, γ^k, V(c), error, weight, plain error) tuples, written
    # out over the segments (the same operations in the same order, no tuple per child:
    # a backup runs once per node in every batch and per changed node in search)
    depth = node.depth
    qs: list[float] = []
    signal = rest = acc = 0.0
    step, action, t = noise.backup_terms(depth)
    for eid in node.children:
        sg = segments[eid]
        c = sg.child
        vc = value[c]
        if vc is None:
            continue
        disc, w1 = sg.discount, sg.weight
        qs.append(sg.reward + disc * vc)
        sig = action * min(w1, 1.0)
        signal += sig
        rest += step * w1 - sig + disc * disc * error[c]
        acc += step * w1 + disc * disc * plain[c]
    return _backed_up_terms(node.value, qs, signal, rest, acc, noise, depth, kappa, influence, t)


def settle_children(
    tree: Tree,
    node: Node,
    segments: Mapping[int, Segment],
    value: dict[int, float | None],
    weight: dict[int, float],
    error: dict[int, float],
    plain: dict[int, float],
    noise: NoiseModel,
    kappa: float | None,
    truncation: Truncation,
    only: Container[int] | None = None,
    valid: int | None = None,
) -> None:
    """Refine ``node``'s checkpoint children again with their :func:`value_influence`,
    now that ``node``'s valid children are known (their values were computed first
    without it: a child's validity does not depend on its weight). Called at each
    checkpoint's step before its own value, children first, by :func:`tree_values`
    and by search's incremental rankings alike. Nothing to do with a fixed κ, or for
    fewer than two valid children (an only child's influence is 0). ``only``: refine
    just these children (an incremental update whose other children were refined
    with the same count of valid children already, and are unchanged below); ``valid``:
    how many of ``node``'s children have a value, if the caller counted them."""
    if kappa is not None:
        return
    kids = [segments[eid] for eid in node.children]
    m_p = sum(1 for sg in kids if value.get(sg.child) is not None) if valid is None else valid
    if m_p < 2:
        return
    for sg in kids:
        if only is not None and sg.child not in only:
            continue
        child = tree.nodes[sg.child]
        if child.is_leaf or child.value is None or value.get(sg.child) is None:
            continue
        r = node_value(
            child, segments, value, error, noise, kappa, truncation, plain, value_influence(sg.discount, m_p)
        )
        value[sg.child], weight[sg.child], error[sg.child], plain[sg.child] = r.value, r.weight, r.error, r.plain_error


def tree_values(
    tree: Tree,
    *,
    gamma: float = 1.0,
    kappa: float | None = None,
    noise: NoiseModel | None = None,
    truncation: Truncation = "bootstrap",
    segments: Mapping[int, Segment] | None = None,
) -> TreeValues:
    """Back values up from the leaves to the root (children before parents).

    ``kappa`` fixes the critic's weight at ``κ/(κ+m)``; ``None`` (the default) takes it
    from ``noise``, or from a noise model fitted on this tree alone when none is given.
    ``segments``: edge segments at ``gamma`` known already (a search's ranking keeps
    them), taken for the edges they hold instead of made again.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if noise is None:
        noise = noise_model([tree], gamma=gamma, truncation=truncation) if kappa is None else NoiseModel.unknown()
    kind = {i: n.kind for i, n in tree.nodes.items()}
    v_hat = {i: n.value for i, n in tree.nodes.items()}
    value: dict[int, float | None] = {}
    error: dict[int, float] = {}
    plain: dict[int, float] = {}
    weight: dict[int, float] = {}
    q_bar: dict[int, float | None] = {}
    child_q: dict[int, tuple[float, ...]] = {}
    m: dict[int, int] = {}
    edges = tree.edges
    known = segments if segments is not None else {}
    segs = {
        i: sg if (sg := known.get(i)) is not None and sg.child == e.child else segment(e, gamma)
        for i, e in edges.items()
    }
    # A checkpoint with a prediction below another is refined once, at its parent's
    # step, with its influence (as search's rankings do, focus.ranking): refined at its
    # own step too, settle_children replaced all but its Q̄ and child values there.
    deferred: dict[int, Node] = {}
    out = (value, weight, error, plain, q_bar, child_q, m)
    for node in tree.postorder():
        i = node.id
        if kappa is None and not node.is_leaf:
            _settle_deferred(node, segs, deferred, out, noise, truncation)
            if node.value is not None and node.parent_edge is not None:
                deferred[i] = node
                continue
        r = node_terms(node, segs, value, error, noise, kappa, truncation, plain)
        value[i], weight[i], error[i], plain[i] = r[0], r[1], r[2], r[7]
        if not node.is_leaf:
            q_bar[i], child_q[i], m[i] = r[3], r[4], len(r[4])
    # the Monte Carlo values and the returns from the root read only the leaves' values
    # and the segments: computed when an estimator first reads them (DirectBranchTd, the
    # collector's default, reads neither: a fifth of a batch's backups)
    returns = _Returns(tree, segs, value)
    mc, root_return, leaf_returns = _LazyMap(returns, 0), _LazyMap(returns, 1), _LazyTuple(returns)
    return TreeValues(
        gamma,
        weight,
        kind,
        v_hat,
        value,
        error,
        q_bar,
        child_q,
        m,
        mc,
        root_return,
        leaf_returns,
        noise,
        plain,
        segs,
    )


def _settle_deferred(
    node: Node,
    segs: Mapping[int, Segment],
    deferred: dict[int, Node],
    out: tuple[dict[int, Any], ...],
    noise: NoiseModel,
    truncation: Truncation,
) -> None:
    """:func:`settle_children` of ``node`` where its children with a prediction were
    left to this step (``deferred``, taken out here): each refined once, with its
    :func:`value_influence` where ``node`` has two or more valid children (a child with
    a prediction always has a value), without one otherwise, as its own step would
    have. ``out``: the backup's value, weight, error, plain error, Q̄, child values and
    count, by node."""
    value, weight, error, plain, q_bar, child_q, m = out
    m_p = 0
    for eid in node.children:
        c = segs[eid].child
        if c in deferred or value.get(c) is not None:
            m_p += 1
    for eid in node.children:
        sg = segs[eid]
        c = sg.child
        child = deferred.pop(c, None)
        if child is None:
            continue
        infl = value_influence(sg.discount, m_p) if m_p >= 2 else 0.0
        r = node_terms(child, segs, value, error, noise, None, truncation, plain, infl)
        value[c], weight[c], error[c], plain[c] = r[0], r[1], r[2], r[7]
        q_bar[c], child_q[c], m[c] = r[3], r[4], len(r[4])


class _Returns:
    """:attr:`TreeValues.mc`, :attr:`~TreeValues.root_return` and
    :attr:`~TreeValues.leaf_returns` of one backup, computed on the first read of any."""

    __slots__ = ("_args", "_out")

    def __init__(self, tree: Tree, segs: Mapping[int, Segment], value: Mapping[int, float | None]) -> None:
        self._args: tuple[Tree, Mapping[int, Segment], Mapping[int, float | None]] | None = (tree, segs, value)
        self._out: tuple[dict[int, float | None], dict[int, float | None], tuple[float, ...]] | None = None

    def get(self) -> tuple[dict[int, float | None], dict[int, float | None], tuple[float, ...]]:
        out = self._out
        if out is None:
            assert self._args is not None
            tree, segs, value = self._args
            out = self._out = (_monte_carlo(tree, segs, value), *_root_returns(tree, segs, value))
            self._args = None
        return out


class _LazyMap(Mapping[int, "float | None"]):
    """A dict of :class:`_Returns`, read through (equal to that dict, as a mapping is)."""

    __slots__ = ("_src", "_k")

    def __init__(self, src: _Returns, k: int) -> None:
        self._src, self._k = src, k

    def _dict(self) -> dict[int, float | None]:
        return self._src.get()[self._k]  # type: ignore[return-value]

    def __getitem__(self, key: int) -> float | None:
        return self._dict()[key]

    def get(self, key: int, default: float | None = None) -> float | None:  # type: ignore[override]
        return self._dict().get(key, default)

    def __iter__(self) -> Iterator[int]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())

    def __repr__(self) -> str:
        return repr(self._dict())


class _LazyTuple(Sequence[float]):
    """The leaf returns of :class:`_Returns`, read through (equal to that tuple)."""

    __slots__ = ("_src",)

    def __init__(self, src: _Returns) -> None:
        self._src = src

    def __getitem__(self, i: Any) -> Any:
        return self._src.get()[2][i]

    def __len__(self) -> int:
        return len(self._src.get()[2])

    def __iter__(self) -> Iterator[float]:
        return iter(self._src.get()[2])

    def __eq__(self, other: object) -> bool:
        mine = self._src.get()[2]
        return mine == (tuple(other) if isinstance(other, _LazyTuple) else other)

    def __hash__(self) -> int:
        return hash(self._src.get()[2])

    def __repr__(self) -> str:
        return repr(self._src.get()[2])


def _monte_carlo(tree: Tree, segs: Mapping[int, Segment], value: Mapping[int, float | None]) -> dict[int, float | None]:
    """Plain Monte Carlo value of each node: the mean return from it over every valid
    leaf below it (the leaves' values are final before any checkpoint's)."""
    mc_sum: dict[int, float] = {}
    mc_n: dict[int, int] = {}
    for node in tree.postorder():
        i = node.id
        if node.is_leaf:
            v = value[i]
            mc_sum[i], mc_n[i] = (v, 1) if v is not None else (0.0, 0)
            continue
        s, cnt = 0.0, 0
        for eid in node.children:
            sg = segs[eid]
            if mc_n[sg.child]:
                s += mc_n[sg.child] * sg.reward + sg.discount * mc_sum[sg.child]
                cnt += mc_n[sg.child]
        mc_sum[i], mc_n[i] = s, cnt
    return {i: (mc_sum[i] / mc_n[i] if mc_n[i] else None) for i in tree.nodes}


def _root_returns(
    tree: Tree, segs: Mapping[int, Segment], value: Mapping[int, float | None]
) -> tuple[dict[int, float | None], tuple[float, ...]]:
    """Mean discounted return from the root of the valid leaves below each node, and
    every valid leaf's return (in reverse postorder)."""
    edges = tree.edges
    # Returns from the root: prefix rewards top-down (ids grow downward).
    prefix: dict[int, tuple[float, float]] = {tree.ROOT: (0.0, 1.0)}  # (discounted reward so far, discount)
    for i in sorted(tree.nodes):
        nd = tree.nodes[i]
        if nd.parent_edge is not None:
            r0, d = prefix[edges[nd.parent_edge].parent]
            sg = segs[nd.parent_edge]
            prefix[i] = (r0 + d * sg.reward, d * sg.discount)
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
            ret_sum[i] = left_sum(ret_sum[segs[eid].child] for eid in node.children)
            ret_n[i] = sum(ret_n[segs[eid].child] for eid in node.children)
    root_return: dict[int, float | None] = {i: (ret_sum[i] / ret_n[i] if ret_n[i] else None) for i in tree.nodes}
    return root_return, tuple(leaf_returns[::-1])
