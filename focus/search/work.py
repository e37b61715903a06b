"""What the parts of a plan will read of a state, told from its caches alone, without
computing any of it: what :mod:`focus.placement` estimates a call's cost from, to run it
on the event loop or in a worker thread."""

from __future__ import annotations

from collections.abc import Iterable
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
    spent is not summed yet; ``trees``, the trees a plan reads first (every tree, or
    where the state's plan index holds, :class:`focus.search.heads.PlanIndex`, those
    changed since the last plan)."""

    fit: bool
    fresh: int
    changed: int
    undrawn: int
    unsummed: int
    trees: int


def ranking_work(state: SearchState, search: Priority) -> RankingWork:
    """What bringing the rankings up to date under ``state.calibration(search)`` reads
    (:func:`focus.search.plan_rank`), and what a wave's leading exploration picks read
    (:func:`focus.search.plan_lead`). Reads only what is cached: where telling the
    calibration's size would take a fit or a spread count not made yet, ``fit`` (no fit
    runs to decide where the fit runs). About a microsecond per tree it looks at: the
    trees changed since the last plan where the state's plan index holds under that
    calibration and they are all ranked under it (then no lead reads every tree), else
    every tree."""
    work = trees_work(state, search)
    assert work is not None
    return work


def trees_work(state: SearchState, search: Priority, limit: float | None = None) -> RankingWork | None:
    """:func:`ranking_work`, or ``None`` where that would look at more than ``limit`` trees."""
    try:
        calib: Calibration | None = state._cached_fit(state._fit_size(search, at_hand=True), search)
    except NotAtHand:  # to be fitted (or not to be told from the cache): every tree ranked again
        calib = None
    index = state._index
    if calib is not None and index is not None and index.holds(search, calib, state.seed):
        work = _work(state, search, calib, sorted(index.unranked | index.unspent))
        if work.fresh == 0:
            return work
    if limit is not None and len(state.trees) > limit:
        return None
    return _work(state, search, calib, range(len(state.trees)))


def _work(state: SearchState, search: Priority, calib: Calibration | None, trees: Iterable[int]) -> RankingWork:
    """:func:`ranking_work` over ``trees``."""
    fresh = changed = undrawn = unsummed = read = 0
    derived, seed, all_trees = state._derived, state.seed, state.trees
    for ti in trees:  # _TreeFacts.describes and .built, inline
        tree = all_trees[ti]
        read += 1
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
    return RankingWork(calib is None, fresh, changed, undrawn, unsummed, read)
