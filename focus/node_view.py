"""A checkpoint's evidence view: what :class:`focus.priority.NodeEvidence` holds, computed.

:func:`node_evidence` builds the views of a whole tree from scratch; search keeps them
up to date incrementally (:mod:`focus.ranking`) with the same per-node function,
:func:`node_view`, which reads only the node, its children's values and errors and its
parent's weight, count and valid child tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from focus.calibration import Calibration
from focus.estimation import NoiseModel, Segment, TreeValues, segment, value_influence
from focus.priority import NodeEvidence, make_evidence
from focus.sums import left_sum
from focus.tree import Node, Tree
from focus.weighting import checkpoint_critic_error


def node_evidence(
    tree: Tree,
    tree_index: int,
    values: TreeValues,
    calibration: Calibration,
    pending: dict[int, int] | None = None,
) -> dict[int, NodeEvidence]:
    """Evidence views of every checkpoint of ``tree`` (from scratch; search keeps them
    up to date incrementally with the same per-node functions, :func:`node_view`)."""
    pending = pending or {}
    segs = {i: segment(e, values.gamma) for i, e in tree.edges.items()}
    lengths: dict[int, float] = {}
    valid: dict[int, float] = {}
    for node in tree.postorder():
        lengths[node.id] = segment_length(node, segs, lengths)
        valid[node.id] = valid_tokens(node, segs, values.value)
    return {
        node.id: node_view(
            tree, node, tree_index, values, calibration, segs, lengths[node.id], valid, pending.get(node.id, 0)
        )
        for node in tree.checkpoints()
    }


class _Step(Protocol):
    """What a length reads of a child segment: a :class:`Segment` or the tree's own
    :class:`focus.tree.Edge` (the same ``k``, transitions, and ``child``)."""

    @property
    def k(self) -> int: ...

    @property
    def child(self) -> int: ...


def segment_length(node: Node, segs: Mapping[int, _Step], lengths: Mapping[int, float]) -> float:
    """Expected task transitions from ``node`` to a leaf: the mean over its children of
    the segment's k plus the child's (0 at a leaf, NaN without children)."""
    if node.is_leaf:
        return 0.0
    ch = node.children
    return left_sum(segs[e].k + lengths[segs[e].child] for e in ch) / len(ch) if ch else math.nan


def subtree_length(tree: Tree, node_id: int, memo: dict[int, float]) -> float:
    """:func:`segment_length` of ``node_id`` with its descendants' computed the same way
    (the same sums in the same order as a ranking's), from the tree alone: what a
    planner reads before any ranking is built (``focus.search.planning``). ``memo``
    keeps the lengths found, by node id, for the next call on the same tree."""
    stack = [(node_id, False)]
    while stack:
        i, expanded = stack.pop()
        if i in memo:
            continue
        node = tree.nodes[i]
        if node.is_leaf:
            memo[i] = 0.0
            continue
        if not expanded:
            stack.append((i, True))
            stack.extend((tree.edges[e].child, False) for e in node.children if tree.edges[e].child not in memo)
            continue
        memo[i] = segment_length(node, tree.edges, memo)
    return memo[node_id]


def valid_tokens(node: Node, segs: Mapping[int, Segment], value: Mapping[int, float | None]) -> float:
    """Tokens of ``node``'s child segments whose child has a value (0 at a leaf)."""
    return float(sum(segs[e].tokens for e in node.children if value.get(segs[e].child) is not None))


def node_view(
    tree: Tree,
    node: Node,
    tree_index: int,
    values: TreeValues,
    calibration: Calibration,
    segs: Mapping[int, Segment],
    length: float,
    valid: Mapping[int, float],
    pending: int = 0,
) -> NodeEvidence:
    """The evidence view of one checkpoint. It reads the node, its children's values
    and errors, and its parent's weight, count and valid child tokens: nothing else,
    so after a graft only the changed nodes and their children need a new view.
    Influence of V(n) on the advantages above it (tokens relative to the calibration's
    mean segment, times the squared derivative of the advantage with respect to V(n)):
    V(n) moves V(p) by ``c = (1−λ_p)·γ^k/m_p``, so the parent segment counts
    ``(γ^k − c)²`` (0 for an only child backed up with λ_p = 0: the change cancels) and
    each sibling segment ``c²``; ancestors further up are left out (their share is at
    most that factor squared again)."""
    i, depth = node.id, node.depth
    mu = calibration.mean_tokens or 1.0
    gamma = values.gamma
    noise = calibration.noise
    infl, t_infl, v_infl = _parent_terms(tree, node, values, segs, valid, mu)
    terms = calibration._depths.get(depth)  # at_depth's and fresh_chain's caches read first
    step, action, nu, critic = terms if terms is not None else calibration.at_depth(depth)
    sig, rest, plain, n = _child_sums(node, values, segs, step, action)
    if length != length:  # NaN: no children
        length = max(1.0, calibration.mean_leaf_transitions - node.transitions)
    key = (depth + 1, max(int(round(length)) - 1, 0))
    chain = calibration._chains.get(key) or calibration.fresh_chain(*key)
    fresh = nu + gamma * gamma * chain.head_error
    fresh_target = step + gamma * gamma * chain.head_target
    if n:
        sig, rest, plain = sig / n, rest / n, plain / n
    else:
        sig, rest, plain = action, fresh, fresh_target
    qs = values.child_q.get(i, ())
    miss = node.value - values.q_bar[i] if qs and node.value is not None else 0.0  # type: ignore[operator]
    if miss and miss * miss > critic + (sig + rest) / n:  # beyond one deviation (never with t unknown: inf)
        critic = _critic_here(node, qs, values.q_bar[i], (sig + rest) / n, noise, critic)
    shared = 0.0  # shared_error's early answer, then the call where it has no early answer
    if not (noise.shared <= 0 or calibration.bootstrapped <= 0):
        shared, rest = shared_error(calibration, depth, length, rest)
    if qs:  # without children's values the factor is 1 (_spread_factor), and 1.0 * x is x
        rho = _spread_factor(node, qs, sig + rest, noise, critic)
        sig, rest = rho * sig, rho * rest
    # in field order, each named (a call naming them costs more than making the view)
    return make_evidence(
        tree_index,  # tree_index
        i,  # node_id
        depth,  # depth
        node.transitions,  # transitions
        node.value,  # value
        node.value_std,  # value_std
        values.value.get(i),  # refined
        values.q_bar.get(i),  # q_bar
        qs,  # child_values
        values.m.get(i, 0),  # m
        len(node.children),  # branches
        pending,  # pending
        infl,  # influence
        max(length, 1.0),  # expected_transitions
        valid[i] / mu,  # child_tokens
        values.critic_weight.get(i, 0.0),  # critic_weight
        sig,  # signal
        rest,  # child_error
        critic,  # critic_var
        fresh,  # fresh_error
        chain.segments,  # chain_error
        plain,  # target_var
        fresh_target,  # fresh_target
        chain.targets,  # chain_target
        t_infl,  # target_influence
        calibration.target_weight,  # target_weight
        calibration.mean_leaf_transitions,  # rollout_transitions
        shared,  # shared_error
        v_infl,  # value_influence
    )


def _parent_terms(
    tree: Tree, node: Node, values: TreeValues, segs: Mapping[int, Segment], valid: Mapping[int, float], mu: float
) -> tuple[float, float, float]:
    """How much V(n) moves the advantages above it, the weight of its plain error in its
    parent's critic target (both 0 for a root or a node without a value), and its
    :func:`focus.estimation.value_influence` (0 for a root), see :func:`node_view`: one
    pass over the parent's figures (a ranking makes a view per changed checkpoint,
    about 70,000 at 40k transitions over 800 tasks)."""
    pe = node.parent_edge
    if pe is None:
        return 0.0, 0.0, 0.0
    sp = segs[pe]
    p = tree.edges[pe].parent
    m_p = values.m.get(p, 0)
    v_infl = value_influence(sp.discount, m_p)
    if not m_p or values.value.get(node.id) is None:
        return 0.0, 0.0, v_infl
    c = (1.0 - values.critic_weight.get(p, 0.0)) * sp.discount / m_p
    own = sp.discount - c
    return (own * own * sp.tokens + c * c * (valid[p] - sp.tokens)) / mu, sp.discount * sp.discount / m_p, v_infl


def _child_sums(
    node: Node, values: TreeValues, segs: Mapping[int, Segment], step: float, action: float
) -> tuple[float, float, float, int]:
    """Summed (signal, noise) variances (:func:`focus.estimation.child_variances`, written
    out) and plain-backup variances of ``node``'s valid children, and their count."""
    value, error, plain_error = values.value, values.error, values.plain_error
    sig, rest, plain, n = 0.0, 0.0, 0.0, 0
    for eid in node.children:
        sg = segs[eid]
        ch = sg.child
        if value.get(ch) is None:
            continue
        w, d = sg.weight, sg.discount
        a = action * min(w, 1.0)
        sig, rest, n = sig + a, rest + (step * w - a + d * d * error[ch]), n + 1
        plain += step * w + d * d * plain_error.get(ch, 0.0)
    return sig, rest, plain, n


def shared_error(calibration: Calibration, depth: int, length: float, rest: float) -> tuple[float, float]:
    """The part of the error of a child of a checkpoint at ``depth`` that all its
    siblings share, and the rest of a child's modelled noise ``rest`` without it
    (issue 31 item 3): a rollout from there ends, about ``length``
    transitions on, on a leaf that bootstraps on the critic with the collection's share
    of bootstrapped leaves; the critic's error there, t(d) discounted by ``γ^{2k}``, is
    shared by the siblings' leaves in the share the noise model fitted from their
    spreads (:attr:`NoiseModel.shared`). More siblings do not average that part away:
    it stays in V(n)'s error at any n, and it cancels in the advantages of n's own
    child segments while V(n) is their plain mean (λ = 0). ``rest`` loses that part,
    but at most the shared share of itself (a child whose own subtree already averaged
    its leaves carries less of the leaf's error than a leaf does)."""
    noise = calibration.noise
    if noise.shared <= 0 or calibration.bootstrapped <= 0:
        return 0.0, rest
    k = max(int(round(length)), 1)
    t = noise.critic_error_at(depth + k)
    shared = noise.shared * calibration.bootstrapped * calibration.gamma ** (2 * k) * t
    return shared, max(rest - shared, (1.0 - noise.shared) * rest)


def _critic_here(
    node: Node, qs: Sequence[float], q_bar: float | None, var_q: float, noise: NoiseModel, critic: float
) -> float:
    """The critic's error variance at this checkpoint: the depth's ``critic``, unless its
    own miss says the critic is wrong here (:func:`focus.weighting.checkpoint_critic_error`;
    an only child too, so that a second child comes and the estimator's test reads it)."""
    if q_bar is None or node.value is None or not noise.known or not math.isfinite(critic):
        return critic
    return checkpoint_critic_error(node.value, qs, q_bar, var_q, critic, only_child=True)


def _spread_factor(node: Node, qs: Sequence[float], v: float, noise: NoiseModel, critic: float | None = None) -> float:
    """The factor on the model's child variances ``v`` that this checkpoint's own
    evidence asks for: its children's spread, or an only child's critic miss.
    ``critic``: ``noise.critic_at(node.depth)``, if known."""
    if len(qs) >= 2 and v > 0:
        # how widely these children spread against the model: one pseudo-observation at 1
        mean = left_sum(qs) / len(qs)
        return (1.0 + left_sum((q - mean) ** 2 for q in qs) / v) / len(qs)
    if critic is None:
        critic = noise.critic_at(node.depth)
    if len(qs) == 1 and v > 0 and node.value is not None and math.isfinite(critic):
        # An only child shows no spread, but the critic's miss does: (v̂ − q)² has
        # expectation t + v, so (v̂ − q)² − t estimates this checkpoint's own one-child
        # variance, beside one pseudo-observation at the model. The depth's average no
        # longer stands for every checkpoint at it: one whose child the critic predicted
        # well expects accurate new segments, one it missed by far expects noisy ones
        # (and a V(n) a sibling would improve more). The miss weighs as its precision
        # against one degree of freedom of a spread, v²/(t + v)² (a squared deviation of
        # variance t + v against one of variance v): with an exact critic a full degree
        # of freedom; with one whose error dominates, little, since its miss is mostly
        # the critic's error, and ranking on it picks the checkpoints where the critic
        # happened to be right, whose residuals then understate t.
        t = critic
        own = max((node.value - qs[0]) ** 2 - t, 0.0)
        den = (t + v) * (t + v)
        # (t + v)² underflows to 0 for variances below about 1e-162 (rewards of 1e-81):
        # the same ratio, formed without the square of a tiny number
        k = v * v / den if den > 0 else (v / (t + v)) ** 2
        return (1.0 + k * own / v) / (1.0 + k)
    return 1.0
