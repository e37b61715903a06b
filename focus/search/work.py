"""What the parts of a plan will read of a state, told from its caches alone, without
computing any of it: what :mod:`focus.placement` estimates a call's cost from, to run it
on the event loop or in a worker thread."""

from __future__ import annotations

from dataclasses import dataclass

from focus.calibration import Calibration
from focus.priority import Priority
from focus.search.state import NotAtHand, SearchState


@dataclass(frozen=True)
class RankingWork:
    """:func:`ranking_work`: ``fit``, the calibration is to be fitted first (a pass over
    every tree; or that cannot be told from the fits cached); ``fresh``, nodes of the
    trees to rank from scratch (every tree's, with ``fit``); ``changed``, nodes changed
    in the others since they were ranked; ``undrawn``, nodes of the trees whose
    checkpoints' exploration draws are not drawn yet; ``unsummed``, trees whose budget
    spent is not summed yet (what a plan reads first of every tree)."""

    fit: bool
    fresh: int
    changed: int
    undrawn: int
    unsummed: int


def ranking_work(state: SearchState, search: Priority) -> RankingWork:
    """What bringing every tree's ranking up to date under ``state.calibration(search)``
    reads (:func:`focus.search.plan_rank`), and what a wave's leading exploration picks
    read (:func:`focus.search.plan_lead`). Reads only what is cached: where telling the
    calibration's size would take a fit or a spread count not made yet, ``fit`` (no fit
    runs to decide where the fit runs). About a microsecond per tree."""
    try:
        calib: Calibration | None = state._cached_fit(state._fit_size(search, at_hand=True), search)
    except NotAtHand:  # to be fitted (or not to be told from the cache): every tree ranked again
        calib = None
    fresh = changed = undrawn = unsummed = 0
    derived, seed = state._derived, state.seed
    for ti, tree in enumerate(state.trees):  # _TreeFacts.describes and .built, inline
        n, f = len(tree.nodes), derived.get(ti)
        if f is None or f.tree is not tree or f.size != (n, tree.rollouts):
            fresh, undrawn, unsummed = fresh + n, undrawn + n, unsummed + 1
            continue
        if f.rank is not None and calib is not None and f.rank.matches(search, calib, seed):
            changed += len(f.changed)
        else:
            fresh += n
        undrawn += 0 if "draws" in f.shape else n
        unsummed += f._spent is None
    return RankingWork(calib is None, fresh, changed, undrawn, unsummed)
