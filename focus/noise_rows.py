"""The noise fit's data: a collection's trees read as checkpoint rows (:mod:`focus.noise`).

Each checkpoint's λ = 0 backup, its children's references and the coefficients of its
backed-up value's variance over the per-depth step variances (α) and the critic's error
(β), computed depth by depth. Split from :mod:`focus.noise` for size; pure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from focus.segments import Segment, segment
from focus.sums import left_sum
from focus.tree import Edge, Tree, Turn
from focus.weighting import Truncation as Truncation  # re-exported: moved there

#: Depths fitted separately; deeper checkpoints share the last bucket's variances.
DEPTH_BUCKETS = 32


def leaf_value(kind: str, v_hat: float | None, truncation: Truncation, critic_var: float) -> tuple[float | None, float]:
    """(value, error variance) of a leaf: terminal 0; truncated v̂ (bootstrap) or 0."""
    if kind == "terminal" or (kind == "truncated" and truncation == "terminal"):
        return 0.0, 0.0
    if kind == "truncated":
        return v_hat, critic_var
    return None, 0.0  # failed


#: Relative size below which a difference of backed-up values is rounding, not data: a
#: value is a sum of a few dozen rewards in doubles (relative error about 1e-15), so
#: siblings that should agree differ by 1e-17 or so, and a squared spread of 1e-33 fed
#: to the fit made its result hang on rounding (a critic exact at one reward scale and
#: not at another: issue 31's scale probe).
ROUNDING = 1e-12

#: Child references of the noise fit: a λ = 0 backed-up value that is exact (a
#: terminal leaf) or the critic's own prediction (a bootstrapped leaf).
_EXACT, _CRITIC = -1, -2


@dataclass(slots=True)
class Checkpoint:
    """One checkpoint's data for the noise fit (λ = 0 backups). Slotted: a search keeps
    a row per checkpoint for its fits and the batch, and a row with a ``__dict__`` of
    its 8 fields took 328 bytes, a slotted one 96 (and is made in half the time)."""

    #: Depth bucket (the column of its step variance) and true depth.
    depth: int
    level: int
    m: int
    #: Σ_j (q_j − Q̄)² when m ≥ 2; the same within groups of children that took the
    #: same action (None without such a pair); (v̂ − Q̄)² when predicted.
    ss: float | None
    ss_same: float | None
    d2: float | None
    #: The critic's prediction v̂ (None when not scored).
    v_hat: float | None
    #: Per valid child: (first-step weight, γ^{2k}, reference: record index or
    #: _EXACT / _CRITIC, (g−1)/g for a child in a group of g ≥ 2 that took the same
    #: action, else 0).
    kids: list[tuple[float, float, int, float]]


def collect(
    tree: Tree,
    gamma: float,
    truncation: Truncation,
    keep: Callable[[Tree, Edge], bool] | None,
    out: list[Checkpoint],
    segments: dict[int, Segment] | None = None,
) -> None:
    """Append one tree's checkpoints to ``out``, children before parents. ``segments``:
    the tree's edge segments at ``gamma`` (:func:`focus.segments.segment`), if known (a
    ranking's, or those computed ahead of it); the edges it lacks are added to it. A
    segment's reward, discount and first-step weight are the numbers
    ``e.discounted_reward(gamma)``, ``gamma ** e.k`` and ``first_step_weight(e.k, gamma)``."""
    nodes, edges = tree.nodes, tree.edges
    segs = segments if segments is not None else {}
    val: dict[int, float | None] = {}
    ref: dict[int, int] = {}
    boot = truncation == "bootstrap"
    leaf_ref = _CRITIC if boot else _EXACT  # a truncated leaf's reference
    seg_of, val_of, add = segs.get, val.get, out.append
    last = DEPTH_BUCKETS - 1
    for i in sorted(nodes, reverse=True):  # children before parents (Tree.postorder)
        node = nodes[i]
        if keep is not None and node.parent_edge is not None and not keep(tree, edges[node.parent_edge]):
            continue
        kind = node.kind
        if kind != "checkpoint":  # leaf_value's value (written out), and the leaf's reference
            if kind == "terminal":
                val[i], ref[i] = 0.0, _EXACT
            elif kind == "truncated":
                val[i], ref[i] = (0.0 if not boot else node.value), leaf_ref
            else:
                val[i], ref[i] = None, _EXACT
            continue
        qs: list[float] = []
        kids: list[tuple[float, float, int, float]] = []
        valid: list[int] = []
        for eid in node.children:
            sg = seg_of(eid)
            if sg is None:
                sg = segs[eid] = segment(edges[eid], gamma)
            c = sg.child
            vc = val_of(c)
            if vc is None:
                continue
            disc = sg.discount
            qs.append(sg.reward + disc * vc)
            valid.append(eid)
            kids.append((sg.weight, disc * disc, ref[c], 0.0))
        m = len(qs)
        if not m:
            val[i], ref[i] = node.value, _CRITIC
            continue
        q_bar = left_sum(qs) / m
        # squared differences at rounding size are 0 (ROUNDING): floor is one value's
        floor = (ROUNDING * max(map(abs, qs))) ** 2
        ss: float | None = None
        ss_same: float | None = None
        if m >= 2:
            ss = _above(left_sum([(q - q_bar) ** 2 for q in qs]), m * floor)
            ss_same, kids = _same_action(qs, [_first_action(edges[e].turns) for e in valid], kids, m * floor)
        value = node.value
        d2 = _above((value - q_bar) ** 2, max(floor, (ROUNDING * value) ** 2)) if value is not None else None
        val[i], ref[i] = q_bar, len(out)
        depth = node.depth
        add(Checkpoint(depth if depth < last else last, depth, m, ss, ss_same, d2, value, kids))


def _same_action(
    qs: list[float], firsts: list[tuple[int, ...]], kids: list[tuple[float, float, int, float]], floor: float
) -> tuple[float | None, list[tuple[float, float, int, float]]]:
    """The sum of squares within groups of children whose first model turn is the same
    (None without such a pair) and the children with their group's ``(g−1)/g``. Each
    child's first action is the exact tokens of its segment's first model turn, read only
    where there are two children to compare (most checkpoints have one, and the turn is a
    few pointers away, all over a large heap)."""
    if len(set(firsts)) == len(qs):
        return None, kids
    index: dict[tuple[int, ...], int] = {}
    groups = [index.setdefault(f, len(index)) for f in firsts]
    members: dict[int, list[float]] = {}
    for q, g in zip(qs, groups, strict=True):
        members.setdefault(g, []).append(q)
    ss_same = _above(left_sum(left_sum((q - left_sum(v) / len(v)) ** 2 for q in v) for v in members.values()), floor)
    sizes = [len(members[g]) for g in groups]
    return ss_same, [(w, d, c, (n - 1) / n) for (w, d, c, _), n in zip(kids, sizes, strict=True)]


def _above(x: float, floor: float) -> float:
    """``x``, or 0 where it is no larger than rounding's ``floor``."""
    return x if x > floor else 0.0


def _first_action(turns: Sequence[Turn]) -> tuple[int, ...]:
    return turns[0].completion_ids if turns else ()


def tree_rows(
    tree: Tree,
    gamma: float,
    truncation: Truncation,
    keep: Callable[[Tree, Edge], bool] | None = None,
    segments: dict[int, Segment] | None = None,
) -> list[Checkpoint]:
    """One tree's rows (:func:`collect` into a list of its own: a child reference is an
    index into this list, which :func:`joined` shifts to the whole collection's)."""
    out: list[Checkpoint] = []
    collect(tree, gamma, truncation, keep, out, segments)
    return out


def joined(parts: Sequence[Sequence[Checkpoint]]) -> tuple[list[Checkpoint], list[int]]:
    """Trees' rows (:func:`tree_rows`) as one list, with each row's offset: its tree's
    first index in the list, which :func:`coefficients` adds to the row's child
    references (so a tree's rows, computed once, serve every fit it enters)."""
    recs: list[Checkpoint] = []
    bases: list[int] = []
    for rows in parts:
        bases.extend([len(recs)] * len(rows))
        recs.extend(rows)
    return recs, bases


def coefficients(
    recs: list[Checkpoint], nd: int, bases: Sequence[int] | None = None
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Each checkpoint's variance coefficients α (per depth bucket) and β, and the rows
    of the same-action spreads, computed depth by depth from the deepest up (a
    checkpoint's children are one level deeper), one vectorised step per level.
    ``bases``: each row's offset for its child references (:func:`joined`; none: the
    references index ``recs`` as they are)."""
    n = len(recs)
    parent, weight, disc2, child, factor = [], [], [], [], []
    for i, r in enumerate(recs):
        b = bases[i] if bases is not None else 0
        for w1, d2, c, f in r.kids:
            parent.append(i)
            weight.append(w1)
            disc2.append(d2)
            child.append(c + b if c >= 0 else c)
            factor.append(f)
    kp = np.array(parent, dtype=np.int64)
    kw = np.array(weight, dtype=np.float64)
    kd2 = np.array(disc2, dtype=np.float64)
    kc = np.array(child, dtype=np.int64)
    kf = np.array(factor, dtype=np.float64)
    bucket = np.array([r.depth for r in recs], dtype=np.int64)
    level = np.array([r.level for r in recs], dtype=np.int64)
    msq = np.array([r.m * r.m for r in recs], dtype=np.float64)
    alpha = np.zeros((n, nd))
    beta = np.zeros(n)
    kid_level = level[kp]
    inner_all = kc >= 0
    for lv in np.unique(level)[::-1]:
        sel = kid_level == lv
        p, c, d2, w = kp[sel], kc[sel], kd2[sel], kw[sel]
        np.add.at(alpha, (p, bucket[p]), w)
        inner = inner_all[sel]
        np.add.at(alpha, p[inner], d2[inner, None] * alpha[c[inner]])
        np.add.at(beta, p[inner], d2[inner] * beta[c[inner]])
        crit = c == _CRITIC
        np.add.at(beta, p[crit], d2[crit])
        rows = np.flatnonzero(level == lv)
        alpha[rows] /= msq[rows, None]
        beta[rows] /= msq[rows]
    # same-action spreads: Σ_g (g−1)/g · Σ_{j∈g} Var(q_j | action), ν for the first transition
    with_same = [i for i, r in enumerate(recs) if r.ss_same is not None]
    row_of = np.full(n, -1, dtype=np.int64)
    row_of[with_same] = np.arange(len(with_same))
    same_rows = np.zeros((len(with_same), 2 * nd))
    same_t = np.zeros(len(with_same))
    pick = (kf > 0) & (row_of[kp] >= 0)
    sp, sc, sd2, sw, sf = kp[pick], kc[pick], kd2[pick], kw[pick], kf[pick]
    sr = row_of[sp]
    first = np.minimum(sw, 1.0)
    np.add.at(same_rows, (sr, nd + bucket[sp]), sf * first)
    np.add.at(same_rows, (sr, bucket[sp]), sf * (sw - first))
    inner = sc >= 0
    np.add.at(same_rows[:, :nd], sr[inner], (sf * sd2)[inner, None] * alpha[sc[inner]])
    np.add.at(same_t, sr[inner], (sf * sd2)[inner] * beta[sc[inner]])
    crit = sc == _CRITIC
    np.add.at(same_t, sr[crit], (sf * sd2)[crit])
    same_y = np.array([recs[i].ss_same for i in with_same], dtype=np.float64)
    # degrees of freedom Σ_g (g − 1): the factors (g−1)/g of a group's g children sum to it
    same_dof = np.array([round(left_sum(fk for *_, fk in recs[i].kids)) for i in with_same], dtype=np.float64)
    return alpha, beta, (same_rows, same_t, same_y, same_dof)
