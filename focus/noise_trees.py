"""Each tree's own step variances s_i(d), shrunk toward the collection's (empirical Bayes).

:func:`focus.noise.noise_model` pools every tree per depth: one s(d) for a collection.
Where tasks decide at different depths (one decisive step each, at its own depth), the
pooled s(d) spreads each decision's variance over every task, and a task's own decisive
depth reads a fraction of it (docs/algorithm.md, "Findings", "Each task's own s(d)").
Here each tree's rows (its spreads and only-child residuals, the pooled fit's moment
equations) move its own s_i(d) away from the pooled s(d) by as much as they justify
against a prior whose spread between trees is measured on the collection. Split from
:mod:`focus.noise` for size; pure.
"""

from __future__ import annotations

import numpy as np

from focus.lsq import mm as _mm
from focus.lsq import mv as _mv

#: The heterogeneities between trees :func:`tree_steps` chooses from (0: trees alike,
#: 1: each tree's whole variance at one depth).
PHI_GRID = (0.0, 1 / 64, 1 / 16, 1 / 4, 1.0)


def tree_steps(
    owner_rows: np.ndarray,
    rows: np.ndarray,
    known: np.ndarray,
    ys: np.ndarray,
    dofs: np.ndarray,
    s: np.ndarray,
    n_trees: int,
) -> tuple[np.ndarray, float]:
    """Per tree, the posterior mean of its step variances (one row per tree, the tree
    ``owner_rows`` names for each row), and the heterogeneity ``φ`` chosen.

    Row ``r`` (a spread or an only-child residual) has expectation
    ``E_r = rows_r·s_i + known_r`` under its tree's own ``s_i`` and is read as a normal
    sample's sum of squares, variance ``V_r = 2·E_r²/dof_r`` (``E_r`` under the pooled
    ``s``). The prior between trees: ``s_i(d) = s(d) + δ_i(d)``, ``δ_i(d)`` independent
    with variance ``τ²(d) = φ·s(d)·(S − s(d))``, ``S = Σ_d s(d)``: ``φ = 1`` is the most
    a collection can differ (each tree puts its whole variance ``S`` at one depth, drawn
    in proportion to ``s(d)``), ``φ = 0`` trees alike. ``φ`` maximises the rows'
    marginal likelihood over :data:`PHI_GRID` (type-II maximum likelihood; with fewer
    than two trees with rows it is 0: one tree is its own pool). The posterior mean
    per tree: ``(I + T·AᵀWA·T)·u = T·AᵀW·e``, ``δ = T·u`` (``T = diag(τ)``, ``e`` the
    rows' residuals under the pooled ``s``, ``W = diag(1/V_r)``), ``s_i = max(s + δ, 0)``."""
    nd = len(s)
    out = np.tile(s, (n_trees, 1))
    total = float(np.sum(s))
    if not len(ys) or total <= 0 or len(set(owner_rows.tolist())) < 2:
        return out, 0.0
    spread = np.maximum(s * (total - s), 0.0)
    expect = _mv(rows, s) + known
    floor = 1e-3 * float(np.median(expect)) + 1e-300
    weight = dofs / (2.0 * (expect + floor) ** 2)
    resid = ys - expect
    order = np.argsort(owner_rows, kind="stable")
    bounds = np.searchsorted(owner_rows[order], np.arange(n_trees + 1))
    grams: list[tuple[int, np.ndarray, np.ndarray]] = []
    for i in range(n_trees):
        ix = order[bounds[i] : bounds[i + 1]]
        if len(ix):
            a, w = rows[ix], weight[ix]
            grams.append((i, _mm(a.T, a * w[:, None]), _mv(a.T, w * resid[ix])))
    best, phi = 0.0, 0.0  # φ = 0: the pooled fit, log-likelihood 0 relative to itself
    for p in PHI_GRID[1:]:
        tau = np.sqrt(p * spread)
        ll = 0.0
        for _, gram, g in grams:
            mat = np.eye(nd) + tau[:, None] * gram * tau[None, :]
            b = tau * g
            ll -= float(np.linalg.slogdet(mat)[1]) - float(b @ np.linalg.solve(mat, b))
        if ll > best + 1e-9 * (abs(best) + 1.0):
            best, phi = ll, p
    if phi <= 0:
        return out, 0.0
    tau = np.sqrt(phi * spread)
    for i, gram, g in grams:
        u = np.linalg.solve(np.eye(nd) + tau[:, None] * gram * tau[None, :], tau * g)
        out[i] = np.maximum(s + tau * u, 0.0)
    return out, phi
