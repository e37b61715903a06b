"""The noise model: how noisy the evidence and the critic are in one collection.

:class:`NoiseModel` holds the per-depth step variances s(d), the env's part ν(d) and
the critic's error variance t; :func:`noise_model` fits them on the λ = 0 backups of
a collection's trees (empirical Bayes, method of moments; ``docs/algorithm.md``, "The
noise model"). Pure and deterministic: the result is rounded to six significant digits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from focus.lsq import depth_walk as _depth_walk
from focus.lsq import mm as _mm
from focus.lsq import mv as _mv
from focus.lsq import nnls as _nnls
from focus.lsq import sig6 as _sig6
from focus.noise_excess import only_excess
from focus.noise_probe import probe_critic, probe_rows
from focus.noise_rows import (
    DEPTH_BUCKETS,
    Checkpoint,
    Truncation,
    coefficients,
    joined,
    leaf_value,
    tree_rows,
)
from focus.segments import first_step_weight
from focus.tree import Edge, Tree

__all__ = ["DEPTH_BUCKETS", "NoiseModel", "Truncation", "first_step_weight", "leaf_value", "noise_model"]


@dataclass(frozen=True)
class NoiseModel:
    """How noisy the evidence and the critic are in one collection (empirical Bayes).

    Model: the first transition of a segment leaving a checkpoint of depth d adds to a
    sampled return an independent variance ``step_var(d)``, of which ``noise_var(d)``
    remains among segments that took the same action (the env's randomness: what no
    amount of branching removes from that segment's advantage) and the rest,
    ``action_var(d)``, is the spread of the actions' true advantages; later
    transitions of a segment add their own (times ``γ^{2i}``). The critic's prediction
    misses the true value by an error of variance ``critic_var``, independent of the
    sampled outcomes. Fitted by the method of moments on λ = 0 backups
    (:func:`noise_model`). ``known`` is False while the collection has no checkpoint
    with two valid continuations, so outcome noise cannot be told from critic error:
    values are then plain backups (λ = 0) and ``critic_var`` is infinite.
    """

    #: Per depth of the segment's parent checkpoint (0 = the root).
    step_vars: tuple[float, ...]
    critic_var: float
    noise_vars: tuple[float, ...] = ()
    #: Checkpoints with a prediction and a valid child; with two or more valid
    #: children; with two children that took the same action.
    residuals: int = 0
    spreads: int = 0
    repeats: int = 0
    known: bool = True
    #: The critic's error variance per depth t(d) (issue 31; empty: ``critic_var`` at
    #: every depth), read off the branched checkpoints' residuals (:func:`_critic_by_depth`)
    #: or, with ``noise_model(joint=True)``, with the only children's too (:func:`_joint_fit`).
    critic_vars: tuple[float, ...] = ()
    #: The share of a bootstrapped leaf's critic error that its siblings share
    #: (:func:`_shared_share`): what more siblings do not average away.
    shared: float = 0.0

    @classmethod
    def unknown(cls, residuals: int = 0) -> NoiseModel:
        return cls((), math.inf, (), residuals, 0, 0, False)

    @staticmethod
    def _at(xs: tuple[float, ...], depth: int, default: float) -> float:
        return xs[min(depth, len(xs) - 1)] if xs else default

    # step_var, noise_var and action_var are :meth:`_at` written out: planning reads
    # them a few million times at 100k transitions.
    def step_var(self, depth: int) -> float:
        xs = self.step_vars
        return xs[min(depth, len(xs) - 1)] if xs else 1.0

    def noise_var(self, depth: int) -> float:
        xs = self.noise_vars
        return xs[min(depth, len(xs) - 1)] if xs else 0.0

    def action_var(self, depth: int) -> float:
        xs, ns = self.step_vars, self.noise_vars
        step = xs[min(depth, len(xs) - 1)] if xs else 1.0
        return max(step - (ns[min(depth, len(ns) - 1)] if ns else 0.0), 0.0)

    @property
    def critic_error(self) -> float:
        """Error variance of a value taken from the critic (0 while unknown)."""
        return self.critic_var if self.known else 0.0

    def critic_at(self, depth: int) -> float:
        """The critic's error variance at ``depth`` (infinite while unknown)."""
        return self._at(self.critic_vars, depth, self.critic_var) if self.known else self.critic_var

    def critic_error_at(self, depth: int) -> float:
        """Error variance of a value taken from the critic at ``depth`` (0 while unknown)."""
        return self._at(self.critic_vars, depth, self.critic_var) if self.known else 0.0

    def backup_terms(self, depth: int) -> tuple[float, float, float]:
        """``(step_var, action_var, critic_error_at)`` at ``depth``, computed once per depth
        and kept on the instance (outside the fields: equality, hashing and copies do not
        see it): a backup reads all three per node, a ranking rebuild about 140,000
        times at 100k transitions over 2,000 tasks, for a handful of depths."""
        cache = self.__dict__.get("_backup_terms")
        if cache is None:
            cache = self.__dict__["_backup_terms"] = {}
        hit = cache.get(depth)
        if hit is None:
            hit = cache[depth] = (self.step_var(depth), self.action_var(depth), self.critic_error_at(depth))
        return hit


#: Pseudo-observations (per depth, in degrees of freedom of a typical spread) of the
#: prior that neighbouring depths have similar variances: a depth with few spreads
#: leans on its neighbours.
_DEPTH_PRIOR_DOF = 8.0
#: Pseudo-residuals pulling the critic's error variance toward "as far off as the
#: sampling noise of a typical backed-up value": a critic is not trusted on a handful
#: of residuals.
_CRITIC_PRIOR_DOF = 2.0
#: Pseudo-observations (per depth) that the env's share of a transition's variance is
#: the share measured where siblings took the same action, pooled over depths; and
#: pseudo-observations of that pooled share at one half: without any such siblings the
#: split is unknown and taken halfway, not as "all signal" (which would trust every
#: spread as reducible).
_NOISE_PRIOR_DOF = 2.0


def _env_share(nu: np.ndarray, s: np.ndarray, dof: np.ndarray) -> float:
    """The env's share ν/s of a transition's variance, pooled over the depths whose
    same-action spreads measured it (weighted by their degrees of freedom), with
    ``_NOISE_PRIOR_DOF`` pseudo-observations at one half. Whether an env is random is
    mostly a property of the env, not of a depth: a deterministic env shows ν ≈ 0
    wherever siblings repeat an action, and the depths without such siblings should
    assume the same rather than a coin flip's half."""
    num, den = [_NOISE_PRIOR_DOF * 0.5], [_NOISE_PRIOR_DOF]
    for v, sd, k in zip(nu.tolist(), s.tolist(), dof.tolist(), strict=True):
        if k > 0 and sd > 0:
            num.append(k * min(v / sd, 1.0))
            den.append(k)
    return math.fsum(num) / math.fsum(den)


def noise_model(
    trees: Sequence[Tree],
    *,
    gamma: float = 1.0,
    truncation: Truncation = "bootstrap",
    keep: Callable[[Tree, Edge], bool] | None = None,
    rows: Sequence[Sequence[Checkpoint]] | None = None,
    joint: bool = False,
    excess: bool = False,
    probe: float = 0.0,
    probe_only: bool = False,
) -> NoiseModel:
    """Fit the step variances s(d), the same-action noise variances ν(d) ≤ s(d) and
    the critic's error variance t on the λ = 0 backups of ``trees`` (method of
    moments, pooled over every checkpoint of every tree).

    Each checkpoint's backed-up value Q̄(n) has variance ``Σ_d α_n(d)·s(d) + β_n·t``:
    α_n follows from the children's (a child value ``r + γ^k V(c)`` adds its k
    transitions at n's depth to ``γ^{2k}`` times c's), β_n counts leaves that bootstrap
    from the critic. Then:

    * spread: at a checkpoint with m ≥ 2 valid children, the sum of squares of their
      backed-up values around Q̄ has expectation ``(m−1)·m·Var(Q̄)``;
    * same-action spread: within each group of children whose first model turn is the
      same (the same action), the sum of squares has the same form with ν(d) in place
      of s(d) for the first transition;
    * residual: at the same checkpoints, ``(v̂ − Q̄)² − SS/(m(m−1))`` is an unbiased
      estimate of t whatever the model (the correction is the checkpoint's own
      sampling variance of Q̄);
    * only-child residual: at a checkpoint with one valid child, ``(v̂ − Q̄)²`` has
      expectation ``t·(1 + β) + Var(Q̄)``, so with t from the residuals it measures
      the variance where search did not branch (weighed by its precision, from the
      second pass on; not for a constant critic).

    The spreads give s and ν by least squares (each sum weighted by 1/dof) under
    ``0 ≤ ν ≤ s``, with
    ``_DEPTH_PRIOR_DOF`` pseudo-observations per depth that neighbouring depths are
    alike, and ``_NOISE_PRIOR_DOF`` that ν is ρ·s, ρ the env's share pooled over
    the depths with same-action spreads (:func:`_env_share`, one half before any data,
    refitted each pass); the residuals' weighted mean
    (weights ``1/(t + Var(Q̄))²``), with ``_CRITIC_PRIOR_DOF`` pseudo-residuals at the
    median Var(Q̄), gives t. Three passes (t enters the spreads through
    bootstrapped leaves, the residual weights through the previous t), so the fit is a
    deterministic function of the trees. ``keep`` restricts it
    to the segments it accepts and what lies below them. ``rows``: each tree's rows
    (:func:`focus.noise_rows.tree_rows` with the same γ, truncation rule and ``keep``),
    if known: a tree's rows depend on that tree alone, so a caller that keeps them per
    tree (the search state) computes them once per tree version, not once per fit.
    ``joint``, ``excess``, ``probe`` (off by default; measured, not adopted:
    docs/findings/estimator-issue31.md): t(d) fitted with s and ν as one problem
    (:func:`_joint_fit`); plus the only children's significant excess
    (:func:`focus.noise_excess.only_excess`); at least (``probe_only``: just) what the
    continuations drawn for exploration at share ``probe`` show (:mod:`focus.noise_probe`).
    """
    parts = rows if rows is not None else [tree_rows(tree, gamma, truncation, keep) for tree in trees]
    recs, bases = joined(parts)
    residuals = sum(1 for r in recs if r.d2 is not None)
    if not any(r.ss is not None for r in recs):
        return _chain_model(recs, residuals, bases)
    mo = _moments(recs, bases)
    nd = mo.nd
    seen = probe_rows(trees, probe, gamma, truncation, keep) if probe > 0 else None
    fix = functools.partial(probe_critic, *seen, only=probe_only) if seen is not None else None
    x, t, rho, by_depth = _passes(recs, mo, joint, excess, fix)
    shared = _shared_share(mo, t, x, rho, by_depth)
    # Six significant digits: the linear solves go through LAPACK, whose last bits may
    # differ between CPUs; rounded, the model (and so every plan) is the same anywhere.
    return NoiseModel(
        tuple(_sig6(v) for v in x[:nd]),
        _sig6(t),
        tuple(_sig6(v) for v in x[nd:]),
        residuals,
        mo.spreads,
        mo.repeats,
        critic_vars=tuple(_sig6(v) for v in by_depth),
        shared=_sig6(shared),
    )


def _passes(
    recs: list[Checkpoint], mo: _Moments, joint: bool, excess: bool, fix: Callable[[np.ndarray], np.ndarray] | None
) -> tuple[np.ndarray, float, float, np.ndarray]:
    """:func:`noise_model`'s three passes: ``(x, t, ρ, t(d))``, x = (s, ν). With
    ``joint`` (and only-child residuals to read), the second and third fit (s, ν) and
    t(d) as one problem (:func:`_joint_fit`); the first has no t to weigh them by.
    ``fix``: what each pass's t(d) becomes (the exploration continuations': :func:`focus.noise_probe.probe_critic`)."""
    nd = mo.nd
    rho, t = 0.5, 0.0
    x = np.zeros(2 * nd)
    by_depth = np.full(nd, t)
    joint = joint and len(mo.one_y) > 0
    for it in range(3):
        if joint and it:
            x, by_depth = _joint_fit(recs, mo, t, x, rho, by_depth)
        else:
            x = _solve_spreads(mo, t, x, rho, it, by_depth)
        s = x[:nd]
        rho = _env_share(x[nd:], s, mo.repeat_dof)
        t = _critic_error(mo, s, t, it)
        if not (joint and it):
            by_depth = _critic_by_depth(recs, mo, s, t)
            if excess and len(mo.one_y):
                by_depth = by_depth + only_excess(recs, mo, s, t)
        if fix is not None:
            by_depth = fix(by_depth)
    return x, t, rho, by_depth


@dataclass(frozen=True)
class _Moments:
    """The branched fit's moment equations (:func:`noise_model`), built once per fit."""

    nd: int
    alpha: np.ndarray
    beta: np.ndarray
    #: Spread and same-action spread rows over (s, ν), their t coefficients, sums of
    #: squares and degrees of freedom.
    design: np.ndarray
    t_rows: np.ndarray
    ys: np.ndarray
    dofs: np.ndarray
    #: Checkpoints with two or more children and a prediction, and their estimates of t.
    res_ix: list[int]
    t_obs: np.ndarray
    #: Only-child residual rows, their t coefficients (1 + β) and squared misses.
    one_rows: np.ndarray
    one_t: np.ndarray
    one_depth: np.ndarray
    one_y: np.ndarray
    #: Degrees of freedom of the same-action spreads per depth of their first transition.
    repeat_dof: np.ndarray
    spreads: int
    repeats: int


def _moments(recs: list[Checkpoint], bases: Sequence[int]) -> _Moments:
    spread_ix = [i for i, r in enumerate(recs) if r.ss is not None]
    nd = max(r.depth for r in recs) + 1
    alpha, beta, same = coefficients(recs, nd, bases)
    same_rows, same_t, same_y, same_dof = same
    m = np.array([recs[i].m for i in spread_ix], dtype=np.float64)
    scale = (m - 1) * m  # E[SS] = (m−1)·m·Var(Q̄)
    design = np.hstack([alpha[spread_ix] * scale[:, None], np.zeros((len(spread_ix), nd))])
    t_rows = beta[spread_ix] * scale
    ys = np.array([recs[i].ss for i in spread_ix], dtype=np.float64)
    dofs = m - 1
    if len(same_y):
        design = np.vstack([design, same_rows])
        t_rows = np.concatenate([t_rows, same_t])
        ys = np.concatenate([ys, same_y])
        dofs = np.concatenate([dofs, same_dof])
    res_ix = [i for i in spread_ix if recs[i].d2 is not None]
    t_obs = np.array(
        [recs[i].d2 - recs[i].ss / (recs[i].m * (recs[i].m - 1)) for i in res_ix],  # type: ignore[operator]
        dtype=np.float64,
    )
    # degrees of freedom of the same-action spreads whose first transition is at each depth
    repeat_dof = _mv((same_rows[:, nd:] > 0).T.astype(np.float64), same_dof) if len(same_y) else np.zeros(nd)
    # Checkpoints with one child and a prediction: (v̂ − q)² has expectation
    # t·(1 + β) + Σ_d α(d)·s(d) (the chain model's residual). Search picks which
    # checkpoints get a second child, so the spreads describe the checkpoints it chose;
    # these describe the rest, and the depths no spread reaches.
    # (Not with one prediction for every state: that critic's error is the state values'
    # spread, which changes with depth, and no constant t describes it; see _chain_model.)
    one_ix = [] if _one_prediction(recs) else [i for i, r in enumerate(recs) if r.m == 1 and r.d2 is not None]
    one_rows = np.hstack([alpha[one_ix], np.zeros((len(one_ix), nd))])
    one_y = np.array([recs[i].d2 for i in one_ix], dtype=np.float64)
    return _Moments(
        nd, alpha, beta, design, t_rows, ys, dofs, res_ix, t_obs,
        one_rows, 1.0 + beta[one_ix], np.array([recs[i].depth for i in one_ix], dtype=np.int64), one_y,
        repeat_dof, len(spread_ix), len(same_y),
    )  # fmt: skip


def _share_form(nd: int, rho: float) -> np.ndarray:
    """The prior that ν(d) is ρ·s(d), ρ the env's share pooled over the depths with
    same-action siblings (half before any): the quadratic form of Σ_d (ν(d) − ρ·s(d))²."""
    form = np.zeros((2 * nd, 2 * nd))
    for d in range(nd):
        form[d, d], form[nd + d, nd + d] = rho * rho, 1.0
        form[d, nd + d] = form[nd + d, d] = -rho
    return form


def _solve_spreads(mo: _Moments, t: float, x: np.ndarray, rho: float, it: int, t_depth: np.ndarray) -> np.ndarray:
    """One pass's (s, ν) from the spreads (and, from the second pass on, the only-child
    residuals) given the critic's error ``t`` (pooled: the spreads' bootstrapped
    leaves), ``t_depth`` (per depth: an only child's own checkpoint) and the env's share
    ``rho``."""
    mat, rhs = _spread_system(mo, t, t, x, rho, it, t_depth)
    return _solve_av(mat, rhs, mo.nd)


def _solve_av(mat: np.ndarray, rhs: np.ndarray, nd: int) -> np.ndarray:
    """Solve the (s, ν[, extra]) system for (s − ν, ν[, extra]) ≥ 0 and return it as (s, ν[, extra])."""
    # Solved for (a, ν) = (s − ν, ν), both ≥ 0: s = a + ν.
    to_s = np.eye(len(rhs))
    to_s[:nd, nd : 2 * nd] = np.eye(nd)
    mat_av = _mm(_mm(to_s.T, mat), to_s)
    mat_av += 1e-9 * float(np.trace(mat_av)) / len(mat_av) * np.eye(len(mat_av))  # never singular
    av = _nnls(mat_av, _mv(to_s.T, rhs))
    return _mv(to_s, av)


def _spread_system(
    mo: _Moments, t: float, spread_t: float, x: np.ndarray, rho: float, it: int, t_depth: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The normal equations of :func:`_solve_spreads` over (s, ν): the spreads less
    ``spread_t`` times their bootstrapped leaves' coefficients, the only-child residuals
    (from the second pass on) and the priors."""
    nd, design, dofs = mo.nd, mo.design, mo.dofs
    # the prior: neighbouring depths have similar variances
    walk = _depth_walk(nd)
    centre = np.zeros((2 * nd, 2 * nd))
    centre[:nd, :nd] = walk
    centre[nd:, nd:] = walk
    # Sums weighted per degree of freedom. (Inverse-variance weights from the previous
    # pass were tried: a depth fitted near zero then weighs ever more and stays there.)
    w = 1.0 / dofs
    y = mo.ys - spread_t * mo.t_rows
    mat = _mm(design.T, design * w[:, None])
    rhs = _mv(design.T, w * y)
    # the prior's weight: pseudo-observations worth a typical depth's information per dof
    touching = _mv((design > 0).T.astype(np.float64), dofs)
    has = touching > 0
    # no spread informs any depth (every segment's variance coefficient is 0): the
    # prior alone sets the depth variances, at any positive scale
    unit = float(np.median(np.diag(mat)[has] / touching[has])) if has.any() else 1.0
    if it and len(mo.one_y):
        # Each residual weighs as its precision against one degree of freedom of a
        # spread, v²/(t + v)² with v the mean modelled Var(q) of these checkpoints
        # (pooled, so no checkpoint the model calls exact weighs without bound): a
        # full degree of freedom with an exact critic, little with a noisy one. All
        # of them subtract the same estimate of t, whose error they share: N rows
        # and t from n residuals are worth N·n/(N + n) rows of their own noise, so
        # each weighs n/(N + n) of that. The first pass has no t yet and leaves
        # them out.
        one_rows = mo.one_rows
        v_one = float(np.mean(_mv(one_rows[:, :nd], x[:nd])))
        # t = 0: the critic is exact, and a residual measures Var(q) alone, whatever v.
        # (t + v)² underflows to 0 below about 1e-162 (rewards of 1e-81): the ratio unsquared then
        den = (t + v_one) ** 2
        k_one = (v_one * v_one / den if den > 0 else (v_one / (t + v_one)) ** 2) if t > 0 else 1.0
        k_one *= len(mo.res_ix) / (len(mo.one_y) + len(mo.res_ix))
        mat = mat + k_one * _mm(one_rows.T, one_rows)
        # (v̂ − q)² − t(d) − β·t: the checkpoint's own critic error at its depth
        rhs = rhs + k_one * _mv(one_rows.T, mo.one_y - t_depth[mo.one_depth] - t * (mo.one_t - 1.0))
    mat = mat + _DEPTH_PRIOR_DOF * unit * centre + _NOISE_PRIOR_DOF * unit * _share_form(nd, rho)
    return mat, rhs


def _shared_share(mo: _Moments, t: float, x: np.ndarray, rho: float, t_depth: np.ndarray) -> float:
    """The share of a bootstrapped leaf's critic error that its siblings share (issue 31
    item 3), from the spreads.

    Siblings' spreads carry only the part of their leaves' critic errors that differs
    between them: with every two leaves below a checkpoint correlated by ``c``, a spread
    holds ``(1 − c)·t`` times its bootstrapped leaves' coefficient, not ``t``. The
    spreads are fitted once more with that independent part ``u`` a free unknown beside
    s and ν (``_CRITIC_PRIOR_DOF`` pseudo-rows of a typical spread row at ``u = t``,
    independence, the assumption without evidence), and ``c = 1 − u/t``. A critic whose
    errors follow the state (a constant critic, one that is wrong about a region, not a
    state) shows spreads that lack the critic's error, and ``c`` near 1; independent
    per-state errors leave it near 0. 0 without bootstrapped leaves or critic error."""
    rows = mo.t_rows
    if t <= 0 or not np.any(rows > 0):
        return 0.0
    nd = mo.nd
    mat, rhs = _spread_system(mo, t, 0.0, x, rho, 2, t_depth)
    w = 1.0 / mo.dofs
    col = _mv(mo.design.T, w * rows)
    uu = float(np.sum(w * rows * rows))
    prior = _CRITIC_PRIOR_DOF * uu / float(np.count_nonzero(rows > 0))
    n = len(rhs)
    big = np.zeros((n + 1, n + 1))
    big[:n, :n] = mat
    big[:n, n] = big[n, :n] = col
    big[n, n] = uu + prior
    rhs_u = float(np.sum(w * rows * mo.ys)) + prior * t
    u = _solve_av(big, np.append(rhs, rhs_u), nd)[n]
    return min(max(1.0 - u / t, 0.0), 1.0)


def _critic_error(mo: _Moments, s: np.ndarray, t: float, it: int) -> float:
    """The critic's error variance: the weighted mean of the residuals' estimates
    (weights ``1/(t + Var(Q̄))²`` from the previous pass, equal on the first) with
    ``_CRITIC_PRIOR_DOF`` pseudo-residuals at the median Var(Q̄); without residuals,
    the summed step variances."""
    res_ix = mo.res_ix
    if not len(res_ix):
        return float(np.sum(s))
    var_q = _mv(mo.alpha[res_ix], s) + mo.beta[res_ix] * t
    # (a checkpoint whose Q̄ the model calls exact weighs at most as one with
    # a thousandth of the median variance)
    floor = 1e-3 * float(np.median(var_q)) + 1e-100
    wt = np.ones(len(res_ix)) if it == 0 else 1.0 / (t + var_q + floor) ** 2
    prior = float(np.median(var_q))  # a critic as far off as a typical Q̄'s sampling noise
    wp = float(np.mean(wt)) * _CRITIC_PRIOR_DOF
    return max((float(np.sum(wt * mo.t_obs)) + wp * prior) / (float(np.sum(wt)) + wp), 0.0)


def _critic_by_depth(recs: list[Checkpoint], mo: _Moments, s: np.ndarray, t: float) -> np.ndarray:
    """The critic's error variance per depth, t(d) (issue 31).

    Read off the same residuals as the pooled t, ``(v̂ − Q̄)² − SS/(m(m−1))`` at each
    checkpoint with two or more valid children (unbiased for the critic's error there
    whatever s is: no model enters), grouped by the checkpoint's depth, with the pooled
    fit's weights ``1/(t + Var(Q̄))²`` (a root's Q̄ varies most, and its residual says
    least). Per depth ``_DEPTH_PRIOR_DOF`` pseudo-observations that neighbouring depths
    are alike (the same prior as s) and ``_CRITIC_PRIOR_DOF`` at the pooled t, each
    worth a residual of mean weight, so a depth with few residuals leans on its
    neighbours and the pool. Where the ranking chose the branched checkpoints these
    residuals are selected (it branches where the critic's miss was small); the
    continuations :attr:`focus.priority.Selective.explore` places by a hash are not,
    and they reach the depths the ranking avoids. (Reading t(d) off every checkpoint's
    first child instead, ``(v̂ − q_1)² − Var(q_1)``, needs the modelled Var(q_1): where
    the depth prior blurs a decisive step, s is short and t(d) took the difference, 0.04
    for an exact critic.)"""
    nd, res_ix = mo.nd, mo.res_ix
    if not len(res_ix):
        return np.full(nd, t)
    var_q = _mv(mo.alpha[res_ix], s) + mo.beta[res_ix] * t
    floor = 1e-3 * float(np.median(var_q)) + 1e-100
    wt = 1.0 / (t + var_q + floor) ** 2
    weight, total = np.zeros(nd), np.zeros(nd)
    np.add.at(weight, [recs[i].depth for i in res_ix], wt)
    np.add.at(total, [recs[i].depth for i in res_ix], wt * mo.t_obs)
    unit = float(np.mean(wt))
    mat = np.diag(weight) + unit * (_DEPTH_PRIOR_DOF * _depth_walk(nd) + _CRITIC_PRIOR_DOF * np.eye(nd))
    return _nnls(mat, total + unit * _CRITIC_PRIOR_DOF * t)


#: An only child's weight is its precision ``1/(t(d) + v(d))²``, ``v(d)`` its depth's
#: mean modelled Var(q); a depth the fit calls exact weighs at most as one whose
#: Var(q) is this share of the mean over every depth (the lock the chain model's
#: inverse-variance weights had: docs/algorithm.md, "Unbranched rollouts only").
_ONE_FLOOR = 0.05


def _joint_fit(
    recs: list[Checkpoint], mo: _Moments, t: float, x: np.ndarray, rho: float, t_depth: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(s, ν) and t(d) as one least-squares problem: the spreads (as in
    :func:`_spread_system`, with its priors), the branched checkpoints' residuals (as in
    :func:`_critic_by_depth`) and the only-child residuals, each row weighed as its
    precision in one unit: a degree of freedom of a spread whose Var(q) is ``v``, the
    only children's mean. ``t`` (pooled) and ``t_depth`` are the previous pass's.

    An only child's squared miss ``(v̂ − q)²`` has expectation ``t(d) + β·t + Σ α·s``:
    the critic's error at its own checkpoint plus the variance of the one-rollout return
    below. The branched residuals see t(d) only where search branched, which the ranking
    picks where the critic looked right; only children are at every checkpoint a rollout
    passed, so they carry the critic's error where search did not look. Read as
    ``(v̂ − q)² − Var(q)`` with Var(q) from a fit that had not seen them (h44m), every
    shortfall of the modelled Var(q) became critic error; here a row can be explained by
    either unknown, and the spreads (s), the branched residuals (t) and the depth priors
    share it out, as one likelihood would. A rare outcome is one squared miss among its
    depth's rows: it moves that depth's mean, not one checkpoint's t. Weights: an only
    child ``v²/(t(d) + v(d) + floor)²``, a branched residual ``v²/(t(d) + Var(Q̄) +
    floor)²`` (t(d), not the pooled t: where the critic is wrong its error dominates a
    row's variance, and the selected residuals, fitted by a t near 0, outweighed the only
    children by (v(d)/Var(Q̄))²); the t(d) priors' pseudo-observations are each worth a
    row of median weight."""
    nd, res_ix, n_one = mo.nd, mo.res_ix, len(mo.one_y)
    mat = np.zeros((3 * nd, 3 * nd))
    rhs = np.zeros(3 * nd)
    mat[: 2 * nd, : 2 * nd], rhs[: 2 * nd] = _spread_system(mo, t, t, x, rho, 0, t_depth)  # no only-child rows
    one_s = mo.one_rows[:, :nd]
    var_one = _mv(one_s, x[:nd])
    v = float(np.mean(var_one))
    cnt, tot = np.zeros(nd), np.zeros(nd)
    np.add.at(cnt, mo.one_depth, 1.0)
    np.add.at(tot, mo.one_depth, var_one)
    ref = v * v
    k_one = (ref / (t_depth + tot / np.maximum(cnt, 1.0) + _ONE_FLOOR * v + 1e-100) ** 2)[mo.one_depth]
    res_depth = np.array([recs[i].depth for i in res_ix], dtype=np.int64)
    var_q = _mv(mo.alpha[res_ix], x[:nd]) + mo.beta[res_ix] * t
    floor = 1e-3 * float(np.median(var_q)) + 1e-100 if len(res_ix) else 1e-100
    w_res = ref / (t_depth[res_depth] + var_q + floor) ** 2
    if ref <= 0:  # every only child modelled exact: equal weights
        k_one, w_res = np.ones(n_one), np.ones(len(res_ix))
    # only-child rows over (s, t(d)): α on s, 1 on their own depth's t (β·t moved right)
    rows = np.hstack([one_s, np.eye(nd)[mo.one_depth]])
    sel = np.r_[0:nd, 2 * nd : 3 * nd]
    mat[np.ix_(sel, sel)] += _mm(rows.T, rows * k_one[:, None])
    rhs[sel] += _mv(rows.T, k_one * (mo.one_y - t * (mo.one_t - 1.0)))
    # branched residuals: t(d) alone
    tt = slice(2 * nd, 3 * nd)
    weight, total = np.zeros(nd), np.zeros(nd)
    np.add.at(weight, res_depth, w_res)
    np.add.at(total, res_depth, w_res * mo.t_obs)
    unit = float(np.median(np.concatenate([k_one, w_res])))
    mat[tt, tt] += np.diag(weight) + unit * (_DEPTH_PRIOR_DOF * _depth_walk(nd) + _CRITIC_PRIOR_DOF * np.eye(nd))
    rhs[tt] += total + unit * _CRITIC_PRIOR_DOF * t
    out = _solve_av(mat, rhs, nd)
    return out[: 2 * nd], out[tt]


def _one_prediction(recs: list[Checkpoint]) -> bool:
    """Whether at least two checkpoints with a child were predicted, all with the same
    value: a constant critic, whose error is the state values' spread (see
    :func:`_chain_model`)."""
    predicted = [r.v_hat for r in recs if r.d2 is not None]
    return len(predicted) >= 2 and len(set(predicted)) == 1


def _chain_model(recs: list[Checkpoint], residuals: int, bases: Sequence[int]) -> NoiseModel:
    """The model from rollouts that never branched (every checkpoint has one valid
    child): each residual ``(v̂ − Q̄)²`` has expectation ``t·(1 + β) + Σ_d α(d)·s(d)``
    (the critic's error plus the one-rollout return's variance below). Its depth
    profile tells s from t only through the prior that neighbouring depths are alike
    (the return's variance grows as the rollout has more steps to go; the part that
    does not is the critic's). ν is the prior's s/2: nothing tells the actions from the
    env's randomness without siblings."""
    res_ix = [i for i, r in enumerate(recs) if r.d2 is not None]
    if not res_ix:
        return NoiseModel.unknown(residuals)
    if _one_prediction(recs):
        # One prediction for every state: the critic knows nothing of the states, so its
        # error is the state values' own spread, which grows with depth as the return is
        # decided, exactly as the return's variance below shrinks. Their sum is flat
        # whatever the depth that decides, so the residuals cannot say where that is.
        return NoiseModel.unknown(residuals)
    nd = max(r.depth for r in recs) + 1
    alpha, beta, _ = coefficients(recs, nd, bases)
    design = np.hstack([alpha[res_ix], (1.0 + beta[res_ix])[:, None]])
    ys = np.array([recs[i].d2 for i in res_ix], dtype=np.float64)
    centre = np.zeros((nd + 1, nd + 1))
    centre[:nd, :nd] = _depth_walk(nd)
    # Every residual weighs the same (one degree of freedom each, as the spreads of the
    # branched fit). Inverse-variance weights from a previous pass were the rule until
    # issue 12's 192-seed runs: a depth the first pass put at zero makes the residuals
    # that end there look exact, their weight grows without bound and the depth stays
    # at zero, so the first wave was planned on zeros that one rollout per task cannot
    # support (docs/algorithm.md, "Unbranched rollouts only").
    mat = _mm(design.T, design)
    rhs = _mv(design.T, ys)
    touching = np.count_nonzero(design[:, :nd] > 0, axis=0).astype(np.float64)
    has = touching > 0
    unit = float(np.median(np.diag(mat)[:nd][has] / touching[has])) if has.any() else 1.0
    mat = mat + _DEPTH_PRIOR_DOF * unit * centre
    mat += 1e-9 * float(np.trace(mat)) / len(mat) * np.eye(len(mat))
    x = _nnls(mat, rhs)
    s = tuple(_sig6(v) for v in x[:nd])
    return NoiseModel(s, _sig6(x[nd]), tuple(_sig6(v / 2) for v in s), residuals, 0, 0)
