"""What every plan reads of every tree, kept for the whole collection and brought up to
date for the trees that changed.

A continuation plan reads three things of every tree: the budget its rollouts spent
(what is left of the phase's), whether its ranking is built under the plan's
calibration (a wave's leading exploration picks are taken only where some tree is not,
``focus.search.planning._Greedy.lead``), and its ranking's head (the greedy choice
merges the trees' rankings). Read from every tree at every plan, that came to about
26 ms a wave at 2,000 tasks, whatever the wave touched (docs/operations.md, "A large
collection"). :class:`PlanIndex` keeps the three: the spent totals per phase, and the
heads of every tree's ranking in one sorted list under one search configuration,
calibration, seed and phase. A successor state takes the index over from its
predecessor with the trees it changed marked (:meth:`PlanIndex.moved`, from
:func:`focus.search.state._successor`), and a plan brings only those up to date, so a
wave's plan costs in proportion to the trees it touched (a bisection each) plus the
jobs it takes. A new calibration (a refit), another configuration or phase, or a state
without an index (unpickled, copied, or one whose successor took it) ranks every tree
and builds the heads again: the same pass the rankings make then.

Everything here is a function of the trees and of their rankings, which are the same
whether updated or built from scratch (:mod:`focus.ranking`), so a plan from a state
with an index is the plan from the same trees without one, job for job; a resumed
state (:func:`focus.search.replay`) builds the same index. It is never pickled. A
state's trees are not to be changed in place (``graft`` and ``with_predictions`` make
successors; :func:`focus.search.copy_state` gives trees to edit): a tree that was is
read again once its facts notice (:meth:`focus.search.state.SearchState.facts`, which
every plan asks of the trees it takes jobs from and of those changed since the last
plan), not by a pass over every tree, whose identities and sizes alone took 1.5 ms a
plan at 1,000 tasks (cache misses, on a loaded machine).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import TYPE_CHECKING

from focus.ranking import Entry
from focus.search.shape import Depths

if TYPE_CHECKING:
    from focus.priority import Calibration, Priority
    from focus.search.state import SearchState


class PlanIndex:
    """Per-tree facts every plan reads, for one collection's trees (module docstring).

    ``unspent`` and ``unranked``: trees whose spent budget or ranking head may have
    moved since they were read (changed by a graft or a score, or new to the index)."""

    __slots__ = (
        "trees",
        "spent",
        "totals",
        "unspent",
        "key",
        "head",
        "heads",
        "unranked",
        "unread",
        "open",
        "depths",
        "open_at",
        "started",
        "undepthed",
    )

    def __init__(self, trees: int) -> None:
        n = self.trees = trees
        #: Each tree's budget spent per phase as last read, and their sums.
        self.spent: list[tuple[tuple[int, int], ...]] = [()] * n
        self.totals: dict[int, int] = {}
        self.unspent: set[int] = set(range(n))
        #: (search, calibration, seed, phase index) of the heads, or ``None``.
        self.key: tuple[Priority, Calibration, int, int] | None = None
        #: Each tree's ranking head (its best eligible entry), and those heads sorted.
        self.head: list[Entry | None] = [None] * n
        self.heads: list[Entry] = []
        self.unranked: set[int] = set()
        #: Trees with nodes the critic has not scored (as last read), and those to read again.
        self.open: set[int] = set()
        self.unread: set[int] = set(range(n))
        #: Each tree's :attr:`focus.search.state._TreeFacts.depths` as last read, and their
        #: sums: checkpoints by (depth, children) and rollouts by (phase, depth).
        self.depths: list[Depths | None] = [None] * n
        self.open_at: dict[tuple[int, int], int] = {}
        self.started: dict[tuple[int, int], int] = {}
        self.undepthed: set[int] = set(range(n))

    def moved(self, touched: Iterable[int]) -> PlanIndex:
        """This index for a successor state whose trees differ from its predecessor's at
        ``touched`` (the predecessor keeps none: its trees are no longer the ones
        described), or for the same state where its facts found those trees changed in
        place (:meth:`focus.search.state.SearchState.facts`)."""
        changed = set(touched)
        self.unspent |= changed
        self.unranked |= changed
        self.unread |= changed
        self.undepthed |= changed
        return self

    def spent_total(self, state: SearchState, phase_index: int) -> int:
        """The budget the rollouts of phase ``phase_index`` spent, over every tree
        (:attr:`focus.search.state._TreeFacts.spent`; integers, so the same sum in any order)."""
        if self.unspent:
            totals = self.totals
            for ti in sorted(self.unspent):
                for p, v in self.spent[ti]:
                    totals[p] -= v
                now = tuple(state.facts(ti).spent.items())
                for p, v in now:
                    totals[p] = totals.get(p, 0) + v
                self.spent[ti] = now
            self.unspent.clear()
        return self.totals.get(phase_index, 0)

    def depth_counts(self, state: SearchState) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
        """Over every tree: checkpoints with a branch state by (depth, children), and
        rollouts by (phase, depth they started at); what the depth-share bound reads
        (``focus.search.depth_share``), brought up to date from the trees that changed
        (integers, so the same counts as a pass over every tree)."""
        if self.undepthed:
            open_at, started = self.open_at, self.started
            for ti in sorted(self.undepthed):
                was, now = self.depths[ti], state.facts(ti).depths
                if now is was:  # (only its predictions changed)
                    continue
                change = now[3]
                if change is not None and change.base is was and was is not None:
                    _add(open_at, change.open, 1)  # what the graft changed, where its base is counted
                    _add(started, change.starts, 1)
                else:
                    if was is not None:
                        _add(open_at, was[0], -1)
                        _add(started, was[1], -1)
                    _add(open_at, now[0], 1)
                    _add(started, now[1], 1)
                self.depths[ti] = now
            self.undepthed.clear()
        return self.open_at, self.started

    def holds(self, search: Priority, calibration: Calibration, seed: int, phase_index: int | None = None) -> bool:
        """Whether the heads are of rankings under this configuration, calibration and
        seed (and, given, phase): then every tree's ranking was built under them when
        the heads were last brought up to date, and only :attr:`unranked` trees may
        have lost theirs since."""
        key = self.key
        if key is None:
            return False
        s, c, d, p = key
        return (
            (s is search or s == search)
            and (c is calibration or c == calibration)
            and d == seed
            and (phase_index is None or p == phase_index)
        )

    def ranked_heads(
        self, state: SearchState, search: Priority, calibration: Calibration, phase_index: int
    ) -> list[Entry]:
        """Every tree's ranking head for phase ``phase_index``, sorted (smallest first, the
        greedy's order), each tree's ranking brought up to date: only those of the
        :attr:`unranked` trees where the heads hold (:meth:`holds`), else every tree's."""
        seed = state.seed
        if not self.holds(search, calibration, seed, phase_index):
            self.key = None
            head: list[Entry | None] = []
            for ti in range(self.trees):
                r = state.facts(ti).ranked(search, calibration, phase_index, seed)
                head.append(r[0] if r else None)
            self.head = head
            self.heads = sorted(h for h in head if h is not None)
            self.unranked.clear()
            self.key = (search, calibration, seed, phase_index)
            return self.heads
        heads = self.heads
        for ti in sorted(self.unranked):
            r = state.facts(ti).ranked(search, calibration, phase_index, seed)
            new, old = (r[0] if r else None), self.head[ti]
            if new != old:
                if old is not None:
                    del heads[bisect.bisect_left(heads, old)]
                if new is not None:
                    bisect.insort(heads, new)
                self.head[ti] = new
        self.unranked.clear()
        return heads

    def unscored_trees(self, state: SearchState) -> list[int]:
        """The trees with nodes the critic has not scored yet, in order
        (:attr:`focus.search.state._TreeFacts.unscored`): what scoring reads each wave."""
        if self.unread:
            for ti in self.unread:
                if state.facts(ti).unscored:
                    self.open.add(ti)
                else:
                    self.open.discard(ti)
            self.unread.clear()
        return sorted(self.open)


def _add(totals: dict[tuple[int, int], int], counts: dict[tuple[int, int], int], sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) ``counts`` from ``totals``, dropping keys at 0."""
    get = totals.get
    for key, n in counts.items():
        left = get(key, 0) + sign * n
        if left:
            totals[key] = left
        else:
            del totals[key]


def plan_index(state: SearchState) -> PlanIndex:
    """``state``'s index; a new one (every tree to read) where it has none."""
    index = state._index
    if index is None:
        index = state._index = PlanIndex(len(state.trees))
    return index


def spent(state: SearchState, phase_index: int) -> int:
    """Budget spent by the rollouts of phase ``phase_index`` over every tree."""
    return plan_index(state).spent_total(state, phase_index)
