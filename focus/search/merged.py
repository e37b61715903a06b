"""The greedy choice's merge of every tree's ranking (:class:`focus.search.planning._Greedy`):
the heads of the rankings, sorted for the collection, and a heap of the next entries of
the trees whose head was taken, popped smallest first.

Under the depth-share bound (:class:`focus.search.depth_share.DepthShare`) most of a late
wave's pops are of checkpoints the bound holds back: at 100k transitions over 2,000
tasks, 3,300-6,900 a wave against 1,300-1,700 jobs taken, every one at one to three
full depths (docs/findings/speed.md, "The held checkpoints of a late wave"). Those pops
run in :meth:`Merged._next_allowed`, one loop with the heap step, the tree's next entry
and the bound's answer inline, instead of a method call for each part; the same
entries popped in the same order.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from focus.priority import EXPLORE
from focus.ranking import Entry, TreeRanking

if TYPE_CHECKING:
    from focus.calibration import Calibration
    from focus.priority import Priority
    from focus.search.depth_share import DepthShare
    from focus.search.state import SearchState

#: A heap item: a ranking entry and the position of the next one in its tree's ranking
#: (-1 for an entry pushed again re-ranked: its tree's next entry is in the heap already).
Item = tuple[float, float, int, int, int]


class Merged:
    """The merge's state (set by the greedy's ``rank``): the collection's sorted heads,
    the trees set aside (a checkpoint pending: their entries come from the heap), the
    checkpoints pending, and each tree's ranking read so far."""

    state: SearchState
    search: Priority
    phase_index: int
    _calib: Calibration
    _heads: list[Entry]
    _aside: set[int]
    _busy: dict[tuple[int, int], int]
    _ranked: dict[int, list[Entry]]
    _rankings: dict[int, TreeRanking]

    def _fetch(self, ti: int) -> list[Entry]:
        """Tree ``ti``'s ranking (:meth:`focus.search.state._TreeFacts.ranked`, keeping the
        ranking: a taken job's view is read there): the only place the merge reads a tree."""
        f = self.state.facts(ti)
        rk = self._rankings[ti] = f.ranking(self.search, self._calib, self.state.seed)
        r = self._ranked[ti] = rk.ranked(f.tree, self.phase_index)
        return r

    def _push_next(self, heap: list[Item], ti: int, pos: int) -> None:
        """Push the next entry of tree ``ti``'s ranking at or after ``pos`` whose node has nothing in flight."""
        r = self._ranked.get(ti)
        if r is None:
            r = self._fetch(ti)
        busy = self._busy
        while pos < len(r) and busy and (ti, r[pos][3]) in busy:
            pos += 1
        if pos < len(r):
            heapq.heappush(heap, (*r[pos], pos))

    def _next(self, heap: list[Item], at: int) -> tuple[Entry, int] | None:
        """Pop the smallest of the heap and the heads from ``at`` on (those of trees set
        aside skipped), pushing its tree's next entry: (the entry, where the heads go
        on), or ``None`` where both are empty. The entry's key is its checkpoint's score
        with what is pending counted (a ranking's entries are of checkpoints with nothing
        pending; one taken is pushed again re-ranked)."""
        heads, aside = self._heads, self._aside
        n = len(heads)
        while at < n and heads[at][2] in aside:
            at += 1
        if heap and (at == n or heap[0] < heads[at]):
            key, tied, ti, nid, pos = heapq.heappop(heap)
            if pos >= 0:
                self._push_next(heap, ti, pos + 1)
            return (key, tied, ti, nid), at
        if at == n:
            return None
        head = heads[at]
        self._push_next(heap, head[2], 1)
        return head, at + 1

    def _next_allowed(
        self, heap: list[Item], at: int, share: DepthShare, held: list[Entry]
    ) -> tuple[Entry, int, int] | None:
        """:meth:`_next` until an entry ``share`` allows (or an exploration pick, never
        held), each one it does not appended to ``held``: (the entry, where the heads go
        on, its checkpoint's depth), or ``None`` where both sources are empty."""
        heads, aside, ranked, busy = self._heads, self._aside, self._ranked, self._busy
        trees, allows = self.state.trees, share.allows
        pop, push = heapq.heappop, heapq.heappush
        n, explore = len(heads), -EXPLORE
        while True:
            while at < n and heads[at][2] in aside:
                at += 1
            if heap and (at == n or heap[0] < heads[at]):
                key, tied, ti, nid, pos = pop(heap)
                top: Entry = (key, tied, ti, nid)
                nxt = pos + 1 if pos >= 0 else -1
            elif at == n:
                return None
            else:
                top = heads[at]
                at += 1
                ti, nid, nxt = top[2], top[3], 1
            if nxt >= 0:  # (_push_next, inline)
                r = ranked.get(ti)
                if r is None:
                    r = self._fetch(ti)
                if busy:
                    while nxt < len(r) and (ti, r[nxt][3]) in busy:
                        nxt += 1
                if nxt < len(r):
                    push(heap, (*r[nxt], nxt))
            depth = trees[ti].nodes[nid].depth
            if top[0] == explore or allows(depth):
                return top, at, depth
            held.append(top)
