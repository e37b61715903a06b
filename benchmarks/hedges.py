"""Benchmark-only variants of :class:`focus.priority.Selective` that hedge its worst
case against uniform branching (docs/findings/estimator-issue31.md, "Hedges"). None is
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
  (:meth:`focus.priority.Priority.wave_share`) takes half of what is left of the phase,
  so at 2H the rest is ranked on a fit that reads the spreads it made (h45w).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from focus.calibration import Calibration
from focus.noise import NoiseModel
from focus.priority import Phase, Selective
from focus.search.shape import tree_spreads
from focus.tree import Edge, Tree

HEDGE_METHODS = (
    "selective_explore50",
    "selective_explore100",
    "selective_unifirst",
    "selective_unifirst_w8",
    "selective_halffirst",
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
    raise ValueError(f"unknown hedge method {method!r} (known: {', '.join(HEDGE_METHODS)})")
