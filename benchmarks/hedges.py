"""Benchmark-only variants of :class:`focus.priority.Selective` that hedge its worst
case against uniform branching (docs/findings/estimator-allocation.md, "Hedges"). None is
a library default; ``benchmarks.estimator_quality --methods`` takes their names.

* ``selective_explore50`` / ``selective_explore100``: ``Selective(explore=0.5)`` and
  ``explore=1.0`` (the default is 0.25): a larger share of continuations placed
  uniformly, independently of the critic and of the outcomes seen.
* ``selective_unifirst``: :class:`UniformFirst`, uniform while nothing but the roots
  has been branched (the first continuation wave), selective from the next fit on.
* ``selective_unifirst_w8``: the same with continuation waves half the default size
  (``Phase.wave_size`` 8), so that at 2H, where a default wave is the whole budget, the
  second half is ranked on a model fitted on the first half's spreads.
* ``selective_halffirst``: :class:`HalfFirst`, a wave planned before any spread
  (:meth:`focus.priority.Priority.wave_share`) takes half of what is left of the phase.
* ``selective_chainmid``: :class:`ChainMid`, the unbranched (chain) noise model with the
  residuals' common part split halfway between the critic and the last steps
  (:func:`chain_midpoint`); ``selective_chainmid_half``: both (h45w's candidate).
* ``selective_depthshare3``: ``Selective(depth_share=3)``, the library's bound on one
  depth's share of a phase's continuations at 3x its uniform share (h45c measured it;
  the library's default since it was measured on five sets, so now the same search as
  ``selective``; kept so that the findings' commands run as written);
  ``selective_chainmid_depthshare3``: that bound with :class:`ChainMid`'s first-wave
  fit (the 2H and 6H fixes together).
* ``selective_nobound``: ``Selective(depth_share=0)``, the default before the bound
  (every depth may take any share of a phase's continuations).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from focus import noise as _nz
from focus.calibration import Calibration
from focus.noise import NoiseModel
from focus.noise_rows import coefficients, joined, tree_rows
from focus.priority import Phase, Selective
from focus.search.shape import tree_spreads
from focus.tree import Edge, Tree

HEDGE_METHODS = (
    "selective_explore50",
    "selective_explore100",
    "selective_unifirst",
    "selective_unifirst_w8",
    "selective_halffirst",
    "selective_chainmid",
    "selective_chainmid_half",
    "selective_depthshare3",
    "selective_chainmid_depthshare3",
    "selective_nobound",
)


def branched_below_root(trees: Sequence[Tree], keep: Callable[[Tree, Edge], bool] | None = None) -> bool:
    """Whether some checkpoint other than a root has two or more children that did not
    fail (of the segments ``keep`` accepts): the evidence phase branches only the roots."""
    for tree in trees:
        root_kept = (
            (lambda t, e: e.parent != t.ROOT) if keep is None else (lambda t, e: e.parent != t.ROOT and keep(t, e))
        )
        if tree_spreads(tree, root_kept):
            return True
    return False


class UniformFirst(Selective):
    """Selective, except that a calibration fitted while no checkpoint below a root has
    two children is replaced by the unknown noise model: every checkpoint then scores
    0 (ties broken by the seeded hash, as for Uniform), so the first continuation wave,
    planned before any spread below the root exists, is uniform. The next fit (after
    that wave is grafted) reads the spreads it made and the ranking is Selective's."""

    def calibrate(
        self, trees: Sequence[Tree], keep: Callable[[Tree, Edge], bool] | None = None, **parts: Any
    ) -> Calibration:
        c = super().calibrate(trees, keep, **parts)
        if branched_below_root(trees, keep):
            return c
        return dataclasses.replace(c, noise=NoiseModel.unknown(c.noise.residuals))


class HalfFirst(Selective):
    """Selective whose waves planned before any spread (one evidence rollout per task,
    no continuation grafted) take half of what is left of the phase: the rest is
    ranked on a fit that reads the spreads they made."""

    def wave_share(self, branched: bool) -> float:
        return 1.0 if branched else 0.5


def _chain_fit(design: np.ndarray, ys: np.ndarray, nd: int, critic: bool) -> np.ndarray:
    """``focus.noise._chain_model``'s least squares for (s, t) ≥ 0 with its depth prior,
    t free (``critic``) or held at 0."""
    if not critic:
        design = design.copy()
        design[:, nd] = 0.0
    centre = np.zeros((nd + 1, nd + 1))
    centre[:nd, :nd] = _nz._depth_walk(nd)
    mat = _nz._mm(design.T, design)
    rhs = _nz._mv(design.T, ys)
    touching = np.count_nonzero(design[:, :nd] > 0, axis=0).astype(np.float64)
    has = touching > 0
    unit = float(np.median(np.diag(mat)[:nd][has] / touching[has])) if has.any() else 1.0
    mat = mat + _nz._DEPTH_PRIOR_DOF * unit * centre
    mat += 1e-9 * float(np.trace(mat)) / len(mat) * np.eye(len(mat))
    if not critic:
        mat[nd, nd] += 1.0  # t's column is empty: its row only holds t at 0
    return _nz._nnls(mat, rhs)


def chain_midpoint(
    trees: Sequence[Tree], gamma: float, truncation: Any, keep: Callable[[Tree, Edge], bool] | None
) -> NoiseModel | None:
    """The unbranched noise model with the part every residual holds (the critic's error
    and the variance of the steps every rollout takes, which no unbranched rollout can
    divide) split halfway: the midpoint of the fits with t free (the library's, which
    gives it all to t) and with t = 0. None where the library's chain model does not
    apply (a spread, no residual, one prediction for every state)."""
    recs, bases = joined([tree_rows(tree, gamma, truncation, keep) for tree in trees])
    res_ix = [i for i, r in enumerate(recs) if r.d2 is not None]
    if not res_ix or any(r.ss is not None for r in recs) or _nz._one_prediction(recs):
        return None
    nd = max(r.depth for r in recs) + 1
    alpha, beta, _ = coefficients(recs, nd, bases)
    design = np.hstack([alpha[res_ix], (1.0 + beta[res_ix])[:, None]])
    ys = np.array([recs[i].d2 for i in res_ix], dtype=np.float64)
    x = (_chain_fit(design, ys, nd, True) + _chain_fit(design, ys, nd, False)) / 2
    s = tuple(_nz._sig6(v) for v in x[:nd])
    return NoiseModel(s, _nz._sig6(x[nd]), tuple(_nz._sig6(v / 2) for v in s), len(res_ix), 0, 0)


class ChainMid(Selective):
    """Selective ranking its waves planned on the unbranched model on
    :func:`chain_midpoint`'s instead of the library's."""

    def calibrate(
        self, trees: Sequence[Tree], keep: Callable[[Tree, Edge], bool] | None = None, **parts: Any
    ) -> Calibration:
        c = super().calibrate(trees, keep, **parts)
        if c.noise.spreads or not c.noise.known:
            return c
        mid = chain_midpoint(trees, self.discount, self.truncation_rule, keep)
        return c if mid is None else dataclasses.replace(c, noise=mid)


class ChainMidHalf(ChainMid, HalfFirst):
    """:class:`ChainMid` and :class:`HalfFirst` together."""


def hedge_search(method: str, phases: tuple[Phase, ...]) -> Selective:
    """The search of one of :data:`HEDGE_METHODS` over ``phases``."""
    if method == "selective_explore50":
        return Selective(phases=phases, explore=0.5)
    if method == "selective_explore100":
        return Selective(phases=phases, explore=1.0)
    if method == "selective_unifirst":
        return UniformFirst(phases=phases)
    if method == "selective_unifirst_w8":
        return UniformFirst(phases=(*phases[:-1], phases[-1].model_copy(update={"wave_size": 8})))
    if method == "selective_halffirst":
        return HalfFirst(phases=phases)
    if method == "selective_chainmid":
        return ChainMid(phases=phases)
    if method == "selective_chainmid_half":
        return ChainMidHalf(phases=phases)
    if method == "selective_depthshare3":
        return Selective(phases=phases, depth_share=3.0)
    if method == "selective_chainmid_depthshare3":
        return ChainMid(phases=phases, depth_share=3.0)
    if method == "selective_nobound":
        return Selective(phases=phases, depth_share=0.0)
    raise ValueError(f"unknown hedge method {method!r} (known: {', '.join(HEDGE_METHODS)})")
