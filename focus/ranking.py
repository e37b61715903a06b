"""One tree's refined values, evidence views and rankings, kept up to date incrementally.

Planning ranks every eligible checkpoint of every tree. Recomputing a tree after each
wave costs in proportion to the tree, so a collection whose waves touch every tree
(few tasks, large budgets) would plan in O(collection) per wave. :class:`TreeRanking`
instead updates only what a wave changed:

* a new or newly scored node changes the refined values (and errors, weights,
  expected lengths, valid child tokens) of itself and its **ancestors**, values being
  backed up from children to parents, and the weights of the ancestors' children (a
  checkpoint's weight reads how many valid children its parent has,
  :func:`focus.estimation.value_influence`; each is refined again at its parent's step,
  :func:`focus.estimation.settle_children`);
* a checkpoint's evidence view (:func:`focus.node_view.node_view`) reads only the node,
  its children and its parent (weight, count, valid child tokens), so the views to
  recompute are those of the changed checkpoints, of their children and of their
  grandchildren;
* each phase's ranking is a sorted list; a changed view moves one entry.

Collection-wide quantities (the noise model, the mean segment length) come from the
search's :class:`~focus.priority.Calibration`, which changes only when the collection
has doubled in waves and in evidence; a new calibration rebuilds the ranking from scratch. Every number is
computed by the same per-node functions as the from-scratch path
(:func:`focus.estimation.node_value`, :func:`focus.node_view.node_view`), children
before parents, so the incremental state equals a rebuild exactly (tested on random
trees).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from focus.agent import derive_seed
from focus.estimation import Segment, TreeValues, node_value, segment, settle_children
from focus.node_view import node_view, segment_length, valid_tokens
from focus.priority import Calibration, NodeEvidence, Priority
from focus.tree import Node, Tree

#: A ranking entry: (-priority, seeded tie-break, tree index, node id); smallest first.
Entry = tuple[float, float, int, int]


def entry(search: Priority, seed: int, ev: NodeEvidence) -> Entry:
    tie = derive_seed("tie", seed, ev.tree_index, ev.node_id, ev.branches + ev.pending) / 2**31
    return (-float(search(ev)), tie, ev.tree_index, ev.node_id)


class TreeRanking:
    """Values, views and per-phase rankings of one tree under one search configuration,
    calibration and collection seed. :meth:`update` brings them to a grown tree."""

    def __init__(
        self,
        tree: Tree,
        index: int,
        search: Priority,
        calibration: Calibration,
        seed: int,
        segments: dict[int, Segment] | None = None,
    ) -> None:
        """``segments``: the tree's edge segments at this ranking's γ, if known (from the
        ranking this one replaces after a refit of the calibration: an edge's segment
        does not depend on it), taken over rather than recomputed."""
        self.index, self.search, self.calibration, self.seed = index, search, calibration, seed
        self.gamma = search.discount
        self.value: dict[int, float | None] = {}
        self.error: dict[int, float] = {}
        self.plain: dict[int, float] = {}
        self.weight: dict[int, float] = {}
        self.q_bar: dict[int, float | None] = {}
        self.child_q: dict[int, tuple[float, ...]] = {}
        self.m: dict[int, int] = {}
        # a TreeValues over the live dicts: the per-node functions read it like tree_values'
        self.values = TreeValues(
            self.gamma,
            self.weight,
            {},
            {},
            self.value,
            self.error,
            self.q_bar,
            self.child_q,
            self.m,
            {},
            {},
            (),
            plain_error=self.plain,
        )
        self.segments: dict[int, Segment] = segments if segments is not None else {}
        self.lengths: dict[int, float] = {}
        self.valid: dict[int, float] = {}
        self.evidence: dict[int, NodeEvidence] = {}
        #: Per phase: the sorted entries of the eligible checkpoints, and each one's entry.
        self._ranked: dict[int, list[Entry]] = {}
        self._entries: dict[int, dict[int, Entry]] = {}
        #: Views recomputed by the last update (what a wave cost; read by tests).
        self.last_views = 0
        for node in tree.postorder():
            self._compute(tree, node)
        for node in tree.checkpoints():
            self.evidence[node.id] = self._view(tree, node)
        self.last_views = len(self.evidence)

    def matches(self, search: Priority, calibration: Calibration, seed: int) -> bool:
        return (
            (self.search is search or self.search == search)
            and (self.calibration is calibration or self.calibration == calibration)
            and self.seed == seed
        )

    def _compute(self, tree: Tree, node: Node) -> None:
        """Values, length and valid child tokens of ``node`` from its children's."""
        segs = self.segments
        for eid in node.children:
            if eid not in segs:
                segs[eid] = segment(tree.edges[eid], self.gamma)
        s = self.search
        i = node.id
        if not node.is_leaf:
            settle_children(
                tree, node, segs, self.value, self.weight, self.error, self.plain,
                self.calibration.noise, s.kappa, s.truncation_rule,
            )  # fmt: skip
        r = node_value(
            node, segs, self.value, self.error, self.calibration.noise, s.kappa, s.truncation_rule, self.plain
        )
        self.value[i], self.weight[i], self.error[i], self.plain[i] = r.value, r.weight, r.error, r.plain_error
        if not node.is_leaf:
            self.q_bar[i], self.child_q[i], self.m[i] = r.q_bar, r.qs, len(r.qs)
        self.lengths[i] = segment_length(node, segs, self.lengths)
        self.valid[i] = valid_tokens(node, segs, self.value)

    def _view(self, tree: Tree, node: Node) -> NodeEvidence:
        i = node.id
        return node_view(
            tree, node, self.index, self.values, self.calibration, self.segments, self.lengths[i], self.valid
        )

    def update(self, tree: Tree, changed: Iterable[int]) -> None:
        """Bring everything to ``tree``, where the nodes ``changed`` are new or have a new
        prediction (and every other node is as it was): their ancestors' values, then
        the views of those checkpoints and of their children, then the rankings."""
        nodes, edges = tree.nodes, tree.edges
        path: set[int] = set()
        for i in changed:
            while i not in path:
                path.add(i)
                pe = nodes[i].parent_edge
                if pe is None:
                    break
                i = edges[pe].parent
        for i in sorted(path, reverse=True):  # ids grow downward: children first
            self._compute(tree, nodes[i])
        views: set[int] = set()
        for i in path:
            node = nodes[i]
            if not node.is_leaf:
                views.add(i)
                # its children were refined again (their weights read its valid
                # children), so their children's views (which read a parent's weight) change
                for c in (edges[e].child for e in node.children):
                    if not nodes[c].is_leaf:
                        views.add(c)
                        views.update(g for g in (edges[e].child for e in nodes[c].children) if not nodes[g].is_leaf)
        for i in sorted(views):
            ev = self.evidence[i] = self._view(tree, nodes[i])
            for phase_index in self._ranked:
                self._move(tree, phase_index, ev)
        self.last_views = len(views)

    def _eligible(self, tree: Tree, phase_index: int, ev: NodeEvidence) -> bool:
        phase = self.search.phases[phase_index]
        return ev.node_id in tree.states and ev.depth <= phase.max_depth and ev.branches < phase.max_branches

    def _move(self, tree: Tree, phase_index: int, ev: NodeEvidence) -> None:
        ranked, entries = self._ranked[phase_index], self._entries[phase_index]
        nid = ev.node_id
        before = entries.pop(nid, None)
        if before is not None:
            del ranked[bisect.bisect_left(ranked, before)]
        if self._eligible(tree, phase_index, ev):
            e = entries[nid] = entry(self.search, self.seed, ev)
            bisect.insort(ranked, e)

    def ranked(self, tree: Tree, phase_index: int) -> list[Entry]:
        """Eligible checkpoints of phase ``phase_index``, best first (nothing pending)."""
        out = self._ranked.get(phase_index)
        if out is None:
            entries = {
                nid: entry(self.search, self.seed, ev)
                for nid, ev in self.evidence.items()
                if self._eligible(tree, phase_index, ev)
            }
            out = self._ranked[phase_index] = sorted(entries.values())
            self._entries[phase_index] = entries
        return out
