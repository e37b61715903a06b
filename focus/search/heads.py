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
state (:func:`focus.search.replay`) builds the same index. It is never pickled. A tree
changed in place (not through ``graft``, which the state's facts guard against too,
:meth:`focus.search.state._TreeFacts.describes`) is found by a sweep of the trees'
identities and sizes, three C-level passes over the list (:meth:`PlanIndex.sweep`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from operator import attrgetter, is_
from typing import TYPE_CHECKING

from focus.ranking import Entry

if TYPE_CHECKING:
    from focus.priority import Calibration, Priority
    from focus.search.state import SearchState
    from focus.tree import Tree

_nodes = attrgetter("nodes")
_rollouts = attrgetter("rollouts")


class PlanIndex:
    """Per-tree facts every plan reads, for one collection's trees (module docstring).

    ``unspent`` and ``unranked``: trees whose spent budget or ranking head may have
    moved since they were read (changed by a graft or a score, or new to the index)."""

    __slots__ = ("trees", "nodes", "rollouts", "spent", "totals", "unspent", "key", "head", "heads", "unranked")

    def __init__(self, trees: Sequence[Tree]) -> None:
        n = len(trees)
        self.trees = list(trees)
        self.nodes = list(map(len, map(_nodes, trees)))
        self.rollouts = list(map(_rollouts, trees))
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

    def moved(self, trees: Sequence[Tree], touched: Iterable[int]) -> PlanIndex:
        """This index for a successor state whose ``trees`` differ from its
        predecessor's at ``touched`` (the predecessor keeps none: its trees are no
        longer the ones described)."""
        for ti in touched:
            tree = trees[ti]
            self.trees[ti], self.nodes[ti], self.rollouts[ti] = tree, len(tree.nodes), tree.rollouts
            self.unspent.add(ti)
            self.unranked.add(ti)
        return self

    def sweep(self, trees: Sequence[Tree]) -> bool:
        """Mark the trees that are not the objects (or not of the sizes) last recorded:
        changed in place or replaced without a successor state. False where the tree
        count differs (the index is of another collection: build a new one)."""
        if len(trees) != len(self.trees):
            return False
        nodes = list(map(len, map(_nodes, trees)))
        rollouts = list(map(_rollouts, trees))
        if nodes != self.nodes or rollouts != self.rollouts or not all(map(is_, trees, self.trees)):
            changed = [
                ti
                for ti, tree in enumerate(trees)
                if tree is not self.trees[ti] or nodes[ti] != self.nodes[ti] or rollouts[ti] != self.rollouts[ti]
            ]
            self.moved(trees, changed)
        return True

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
            for ti in range(len(self.trees)):
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


def plan_index(state: SearchState) -> PlanIndex:
    """``state``'s index, swept for trees changed in place; a new one (every tree to
    read) where it has none."""
    index = state._index
    if index is None or not index.sweep(state.trees):
        index = state._index = PlanIndex(state.trees)
    return index


def spent(state: SearchState, phase_index: int) -> int:
    """Budget spent by the rollouts of phase ``phase_index`` over every tree."""
    return plan_index(state).spent_total(state, phase_index)
