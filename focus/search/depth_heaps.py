"""The greedy choice of a wave under a depth-share bound, one merge per depth.

Under :attr:`focus.priority.Selective.depth_share` a wave takes, at each step, the best
checkpoint of a depth the bound allows (:class:`focus.search.depth_share.DepthShare`).
Merged over every depth, the rankings put the favourites of the full depths first: a
late wave at 100k transitions over 2,000 tasks popped 3,300-6,900 checkpoints it could
not take against 1,100-1,750 it took, and set them aside until the end of the wave
(docs/findings/speed.md, "The held checkpoints of a late wave"). Here every depth has
its own merge of the trees' rankings (each tree's entries of that depth,
:meth:`focus.ranking.TreeRanking.by_depth`; their heads, :meth:`focus.search.heads.
PlanIndex.depth_heads`), and a take compares the tops of the depths the bound allows: a
full depth's entries are not read until it opens again, and when it does the one taken
is its best, so the wave is greedy by score subject to the bound. An exploration pick
(scored ``EXPLORE``) is taken at a full depth as well: those slots are drawn
independently of the ranking and never held. Where no depth with entries is allowed,
the bound is dropped for the rest of the wave and the tops compete unbounded.

Pure and deterministic: entries name their checkpoints, so no two compare equal and
the best top is the same whatever order the depths are scanned in.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Mapping, Sequence

from focus.priority import EXPLORE
from focus.ranking import Entry
from focus.search.depth_share import DepthShare

#: An entry in a depth's heap, with its place in its tree's list of that depth (-1: an
#: entry re-ranked in this wave, which no list holds).
Item = tuple[float, float, int, int, int]

_EXPLORE_KEY = -EXPLORE


class DepthHeaps:
    """Per depth: a sorted list of every tree's best entry of that depth (``heads``) and
    a heap of the next entries of the trees whose head (or a later entry) was taken,
    of the trees set ``aside``, and of entries re-ranked during the wave (:meth:`push`).

    ``lists(ti)``: tree ``ti``'s ranking split by depth, each part best first.
    ``busy``: checkpoints planned or running (the rankings' entries have nothing
    pending; the greedy enters them re-ranked, :meth:`push`): skipped, a head of one
    giving way to its tree's next entry of that depth."""

    def __init__(
        self,
        heads: Mapping[int, Sequence[Entry]],
        lists: Callable[[int], Mapping[int, Sequence[Entry]]],
        busy: Collection[tuple[int, int]],
    ) -> None:
        self.heads, self.lists, self.busy = heads, lists, busy
        self.at: dict[int, int] = dict.fromkeys(heads, 0)
        self.heaps: dict[int, list[Item]] = {d: [] for d in heads}
        #: Each depth's best entry (from its heap or its heads), for depths with one.
        self.tops: dict[int, Entry] = {}
        for d in sorted(self.heaps):
            self._retop(d)
        #: False once no depth with entries was allowed: the rest of the wave is unbounded.
        self.bounded = True

    def _push_next(self, ti: int, d: int, part: Sequence[Entry], pos: int) -> None:
        # the next entry of tree ti's depth-d list at or after pos whose node has nothing in flight
        busy = self.busy
        while pos < len(part) and busy and (ti, part[pos][3]) in busy:
            pos += 1
        if pos < len(part):
            h = self.heaps.get(d)
            if h is None:
                h = self.heaps[d] = []
                self.at[d] = 0
            heapq.heappush(h, (*part[pos], pos))

    def _retop(self, d: int) -> None:
        # a head whose checkpoint is busy gives way to its tree's next entry of depth d
        heads, busy, at = self.heads.get(d, ()), self.busy, self.at[d]
        n = len(heads)
        while busy and at < n and (heads[at][2], heads[at][3]) in busy:
            ti = heads[at][2]
            self._push_next(ti, d, self.lists(ti)[d], 1)
            at += 1
        self.at[d] = at
        h = self.heaps[d]
        if h and (at == n or h[0] < heads[at]):
            self.tops[d] = h[0][:4]
        elif at < n:
            self.tops[d] = heads[at]
        else:
            self.tops.pop(d, None)

    def _pop(self, d: int) -> Entry:
        """Take depth ``d``'s top, pushing its tree's next entry of that depth."""
        heads, h, at = self.heads.get(d, ()), self.heaps[d], self.at[d]
        if h and (at == len(heads) or h[0] < heads[at]):
            item = heapq.heappop(h)
            if item[4] >= 0:
                self._push_next(item[2], d, self.lists(item[2])[d], item[4] + 1)
            top: Entry = item[:4]
        else:
            top = heads[at]
            self.at[d] = at + 1
            self._push_next(top[2], d, self.lists(top[2])[d], 1)
        self._retop(d)
        return top

    def push(self, item: Item, d: int) -> None:
        """Add ``item`` (an entry re-ranked in this wave, place -1) at depth ``d``."""
        h = self.heaps.get(d)
        if h is None:
            h = self.heaps[d] = []
            self.at[d] = 0
        heapq.heappush(h, item)
        top = self.tops.get(d)
        if top is None or item < top:
            self.tops[d] = item[:4]

    def take(self, share: DepthShare | None) -> tuple[Entry, int] | None:
        """The best entry of a depth ``share`` allows (an exploration pick at any depth),
        with its depth, counted into ``share``; once none is allowed, the best of every
        depth from then on (``share`` no longer counted). ``None`` where every depth is
        empty. ``share`` ``None``: unbounded."""
        tops = self.tops
        if not tops:
            return None
        best: Entry | None = None
        depth = -1
        if share is not None and self.bounded:
            allows = share.allows
            for d, t in tops.items():
                if (best is None or t < best) and (t[0] == _EXPLORE_KEY or allows(d)):
                    best, depth = t, d
            if best is None:
                self.bounded = False
            else:
                share.take(depth)
                return self._pop(depth), depth
        for d, t in tops.items():
            if best is None or t < best:
                best, depth = t, d
        return self._pop(depth), depth
