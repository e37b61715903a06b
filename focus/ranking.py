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
  recompute are those of the changed checkpoints, of their children, and of the
  grandchildren below a child whose weight moved;
* a view is computed when some phase may rank its checkpoint; one with as many
  branches as every phase allows is never ranked again (a checkpoint only gains
  children), so its view waits until asked for (:attr:`TreeRanking.evidence`,
  :meth:`TreeRanking.view`) - in a collection of few tasks, most views recomputed after
  a wave were of such checkpoints near the roots;
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
import hashlib
import math
from collections.abc import Iterable

from focus.agent import derive_seed
from focus.backups import Terms, node_terms, value_influence
from focus.estimation import Segment, TreeValues, leaf_value, segment
from focus.node_view import node_view
from focus.priority import Calibration, NodeEvidence, Priority
from focus.tree import Node, Tree

#: A ranking entry: (-priority, seeded tie-break, tree index, node id); smallest first.
Entry = tuple[float, float, int, int]


def tie(seed: int, tree_index: int, node_id: int, slot: int) -> float:
    """The seeded tie-break of continuation slot ``slot`` of a checkpoint (a hash of the
    slot alone, whatever the calibration: a ranking rebuilt for a new one reuses it)."""
    if type(seed) is int and type(tree_index) is int and type(node_id) is int and type(slot) is int:
        # derive_seed's hash of the parts' repr, that repr written out (the same text
        # for ints): the greedy choice re-ranks every job it plans with a new slot
        text = f"('tie', {seed}, {tree_index}, {node_id}, {slot})"
        digest = _blake2b(text.encode(), digest_size=8).digest()
        return (int.from_bytes(digest, "little") & 0x7FFFFFFF) / 2**31
    return derive_seed("tie", seed, tree_index, node_id, slot) / 2**31


_blake2b = hashlib.blake2b


def entry(search: Priority, seed: int, ev: NodeEvidence) -> Entry:
    s = search(ev)
    return (
        -s if type(s) is float and s == s else key_of(search, ev, s),
        tie(seed, ev.tree_index, ev.node_id, ev.branches + ev.pending),
        ev.tree_index,
        ev.node_id,
    )


def key_of(search: Priority, ev: NodeEvidence, score: object) -> float:
    """The ranking key (minus the score) of a score that is not a plain float, or a
    :class:`TypeError` / :class:`ValueError` naming the priority when it is no number or
    NaN: a NaN key compares false with everything, so the rankings' bisections would
    drop other checkpoints' entries and rank the rest in no defined order."""
    where = f"{type(search).__name__}() returned {score!r} for checkpoint {ev.node_id} of tree {ev.tree_index}"
    try:
        f = float(score)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"{where}: a priority returns a number, higher continued first") from None
    if math.isnan(f):
        raise ValueError(f"{where}: a priority's score must not be NaN")
    return -f


#: Known tie-breaks of a tree's checkpoints: node id -> (slot, tie-break).
Ties = dict[int, tuple[int, float]]


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
        ties: Ties | None = None,
    ) -> None:
        """``segments``: the tree's edge segments at this ranking's γ, if known (from the
        ranking this one replaces after a refit of the calibration, or computed while the
        evidence ran: an edge's segment does not depend on the calibration), taken over
        rather than recomputed; ``ties``: tie-breaks known the same way (:meth:`ties`),
        read by the first :meth:`ranked` where a checkpoint's slot is still theirs."""
        self.index, self.search, self.calibration, self.seed = index, search, calibration, seed
        self.gamma = search.discount
        self._truncation = search.truncation_rule
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
        self._ties: Ties = ties if ties is not None else {}
        self.lengths: dict[int, float] = {}
        self.valid: dict[int, float] = {}
        #: Checkpoints computed but for their values, refined at their parent's step
        #: (:meth:`_compute`); empty between updates.
        self._deferred: set[int] = set()
        #: Views of the checkpoints some phase may continue, up to date; the others'
        #: views (``_stale``) are computed when asked for (:attr:`evidence`, :meth:`view`).
        self._views: dict[int, NodeEvidence] = {}
        self._stale: set[int] = set()
        #: The tree the values and views describe (that of the last update).
        self._tree = tree
        #: (max depth, max branches) of every phase: a checkpoint beyond them in all
        #: phases is never ranked (a checkpoint only gains children).
        self._limits = tuple((p.max_depth, p.max_branches) for p in search.phases)
        #: Per phase: the sorted entries of the eligible checkpoints, and each one's entry.
        self._ranked: dict[int, list[Entry]] = {}
        self._entries: dict[int, dict[int, Entry]] = {}
        #: Views recomputed by the last update (what a wave cost; read by tests).
        self.last_views = 0
        for node in tree.postorder():
            self._compute(tree, node)
        for node in tree.checkpoints():
            if self._rankable(tree, node):
                self._views[node.id] = self._view(tree, node)
            else:
                self._stale.add(node.id)
        self.last_views = len(self._views)

    @property
    def evidence(self) -> dict[int, NodeEvidence]:
        """The evidence view of every checkpoint (those no phase ranks computed now)."""
        if self._stale:
            tree = self._tree
            for i in sorted(self._stale):
                self._views[i] = self._view(tree, tree.nodes[i])
            self._stale.clear()
        return self._views

    def view(self, node_id: int) -> NodeEvidence | None:
        """The evidence view of one checkpoint (``None`` for another node)."""
        if node_id in self._stale:
            self._stale.discard(node_id)
            self._views[node_id] = self._view(self._tree, self._tree.nodes[node_id])
        return self._views.get(node_id)

    def _rankable(self, tree: Tree, node: Node) -> bool:
        """Whether some phase may rank ``node`` (the structural part of :meth:`_eligible`:
        it reads only the node's depth and children, which its view copies)."""
        if node.id not in tree.states:
            return False
        depth, branches = node.depth, len(node.children)
        for d, b in self._limits:  # any() over a generator, without the generator
            if depth <= d and branches < b:
                return True
        return False

    def matches(self, search: Priority, calibration: Calibration, seed: int) -> bool:
        return (
            (self.search is search or self.search == search)
            and (self.calibration is calibration or self.calibration == calibration)
            and self.seed == seed
        )

    def _compute(self, tree: Tree, node: Node, path: set[int] | None = None) -> None:
        """Values, length and valid child tokens of ``node`` from its children's.
        ``path``: the nodes an update recomputes (``node`` among them); a child off it
        is as it was, and was refined at this node's step with the count of valid
        children it had then (:attr:`m`): while that count stands, it is not refined
        again (:func:`focus.estimation.settle_children` would compute the same).

        A checkpoint below another with a prediction of its own is refined at its
        parent's step, once the parent's count of valid children is known (the
        parent's :meth:`_compute`): its own step computes only its length and valid tokens
        (:attr:`_deferred`). Computing its value at its own step too, without that
        count's influence, gave numbers the parent's step then replaced in all but
        the refined parts that do not read the influence (its Q̄, child values and
        count): a second :func:`focus.estimation.node_value` per such node."""
        i = node.id
        s = self.search
        noise = self.calibration.noise
        if node.is_leaf:  # no children: its length and valid child tokens are 0
            # node_value's leaf step, without its Refined (the same numbers)
            v, err = leaf_value(node.kind, node.value, self._truncation, noise.backup_terms(node.depth)[2])
            self.value[i], self.weight[i], self.error[i], self.plain[i] = v, 1.0, err, err
            self.lengths[i] = 0.0
            self.valid[i] = 0.0
            return
        segs, value, lengths, gamma, deferred = self.segments, self.value, self.lengths, self.gamma, self._deferred
        # one pass over the children: their segments (made once), how many are valid and
        # their tokens (settle_children's count, valid_tokens' sum: a deferred child has a
        # prediction, so a value), segment_length's sum, and the valid ones to settle
        m_now = tokens = 0
        total: float = 0
        kids: list[tuple[int, Segment, bool]] = []
        for eid in node.children:
            sg = segs.get(eid)
            if sg is None:
                sg = segs[eid] = segment(tree.edges[eid], gamma)
            c = sg.child
            total += sg.k + lengths[c]
            if c in deferred:
                m_now += 1
                tokens += sg.tokens
                kids.append((c, sg, True))
            elif value.get(c) is not None:
                m_now += 1
                tokens += sg.tokens
                kids.append((c, sg, False))
        ch = node.children
        lengths[i] = total / len(ch) if ch else math.nan
        self.valid[i] = float(tokens)
        error, plain, weight, truncation = self.error, self.plain, self.weight, self._truncation
        if s.kappa is not None:  # no influence: nothing to settle, nothing deferred
            self._set(i, node_terms(node, segs, value, error, noise, s.kappa, truncation, plain))
            return
        # settle_children with the deferred children refined in full: one node_value each
        # (no influence below two valid children, as their own step and settle_children
        # left it); a child off the path is refined again only if the count moved
        only = path if path is not None and self.m.get(i) == m_now else None
        nodes = tree.nodes
        for c, sg, was_deferred in kids:
            if was_deferred:
                deferred.discard(c)
                infl = value_influence(sg.discount, m_now) if m_now >= 2 else 0.0
                r = node_terms(nodes[c], segs, value, error, noise, None, truncation, plain, infl)
                value[c], weight[c], error[c], plain[c] = r[0], r[1], r[2], r[7]
                qs = r[4]
                self.q_bar[c], self.child_q[c], self.m[c] = r[3], qs, len(qs)
            elif m_now >= 2 and (only is None or c in only):
                child = nodes[c]
                if child.kind != "checkpoint" or child.value is None:  # (value[c] is not None: a valid child)
                    continue
                r = node_terms(
                    child, segs, value, error, noise, None, truncation, plain, value_influence(sg.discount, m_now)
                )
                value[c], weight[c], error[c], plain[c] = r[0], r[1], r[2], r[7]
        if node.value is not None and node.parent_edge is not None:
            deferred.add(i)  # refined at its parent's step (the loop above, there)
            return
        self._set(i, node_terms(node, segs, value, error, noise, s.kappa, truncation, plain))

    def _set(self, i: int, r: Terms) -> None:
        self.value[i], self.weight[i], self.error[i], self.plain[i] = r[0], r[1], r[2], r[7]
        qs = r[4]
        self.q_bar[i], self.child_q[i], self.m[i] = r[3], qs, len(qs)

    def _view(self, tree: Tree, node: Node) -> NodeEvidence:
        i = node.id
        return node_view(
            tree, node, self.index, self.values, self.calibration, self.segments, self.lengths[i], self.valid
        )

    def update(self, tree: Tree, changed: Iterable[int]) -> None:
        """Bring everything to ``tree``, where the nodes ``changed`` are new or have a new
        prediction (and every other node is as it was): their ancestors' values, then
        the views of those checkpoints and of their children, then the rankings.

        A child off the path keeps its view when nothing it reads moved: its own value
        and weight (refined again at its parent's step) and its parent's weight, count
        and valid child tokens. Everything else a view reads (its children's values
        and errors, its own count, backups and length) is below the path, unchanged.
        About a quarter of the views an update recomputed came out equal to the old
        ones at 40k transitions over 800 tasks, most of them such children."""
        nodes, edges = tree.nodes, tree.edges
        path: set[int] = set()
        for i in changed:
            while i not in path:
                path.add(i)
                pe = nodes[i].parent_edge
                if pe is None:
                    break
                i = edges[pe].parent
        # The children of the path are refined again at their parent's step (their
        # weights read its valid children); the weight of one off the path is what its
        # own children's views read of it (its count and valid tokens stay as they were).
        weight, value, m, valid = self.weight, self.value, self.m, self.valid
        parents: dict[int, tuple[float | None, int | None, float | None]] = {}
        before: dict[int, tuple[float | None, float | None]] = {}
        for i in path:  # (a node's kind, not Node.is_leaf: the loops here run per job grafted)
            node = nodes[i]
            if node.kind == "checkpoint":
                parents[i] = (weight.get(i), m.get(i), valid.get(i))
                for e in node.children:
                    c = edges[e].child
                    if c not in path and nodes[c].kind == "checkpoint":
                        before[c] = (weight.get(c), value.get(c))
        for i in sorted(path, reverse=True):  # ids grow downward: children first
            self._compute(tree, nodes[i], path)
        views = set(parents)
        for i, was in parents.items():
            moved = was != (weight.get(i), m.get(i), valid.get(i))
            for e in nodes[i].children:
                c = edges[e].child
                seen = before.get(c)
                if seen is None:  # a leaf, or on the path: a parent itself, whose children are its own
                    continue
                new_weight = weight.get(c) != seen[0]
                if not (moved or new_weight or value.get(c) != seen[1]):
                    continue  # nothing its view reads moved
                views.add(c)
                # a grandchild's view reads its parent's weight, count and valid
                # tokens: new below a re-weighted child (a view whose inputs are all
                # as they were is as it was)
                if new_weight:
                    for eid in nodes[c].children:
                        g = edges[eid].child
                        if nodes[g].kind == "checkpoint":
                            views.add(g)
        self._tree = tree
        computed = 0
        for i in sorted(views):
            node = nodes[i]
            if self._rankable(tree, node):
                old = self._views.get(i)
                ev = self._views[i] = self._view(tree, node)
                self._stale.discard(i)
                computed += 1
                for phase_index in self._ranked:
                    self._move(tree, phase_index, ev, old)
            else:  # no phase ranks it again: its view waits until asked for
                self._views.pop(i, None)
                self._stale.add(i)
                for phase_index in self._ranked:
                    self._drop(phase_index, i)
        self.last_views = computed

    def _eligible(self, tree: Tree, phase_index: int, ev: NodeEvidence) -> bool:
        phase = self.search.phases[phase_index]
        return ev.node_id in tree.states and ev.depth <= phase.max_depth and ev.branches < phase.max_branches

    def _move(self, tree: Tree, phase_index: int, ev: NodeEvidence, old: NodeEvidence | None = None) -> None:
        """Re-rank ``ev``; ``old``: the view it replaces, whose entry's seeded tie-break
        (a hash of the slot, :func:`entry`) still holds if the node has as many branches."""
        before = self._drop(phase_index, ev.node_id)
        if self._eligible(tree, phase_index, ev):
            if before is not None and old is not None and old.branches == ev.branches and not ev.pending:
                s = self.search(ev)
                e = (
                    -s if type(s) is float and s == s else key_of(self.search, ev, s),
                    before[1],
                    ev.tree_index,
                    ev.node_id,
                )
            else:
                e = entry(self.search, self.seed, ev)
            self._entries[phase_index][ev.node_id] = e
            bisect.insort(self._ranked[phase_index], e)

    def _drop(self, phase_index: int, node_id: int) -> Entry | None:
        before = self._entries[phase_index].pop(node_id, None)
        if before is not None:
            ranked = self._ranked[phase_index]
            del ranked[bisect.bisect_left(ranked, before)]
        return before

    def ties(self) -> Ties:
        """The tie-breaks of the ranked checkpoints, by node (their slots: the views')."""
        out: Ties = {}
        for entries in self._entries.values():
            for nid, e in entries.items():
                ev = self._views.get(nid)
                if ev is not None:
                    out[nid] = (ev.branches + ev.pending, e[1])
        return out

    def ranked(self, tree: Tree, phase_index: int) -> list[Entry]:
        """Eligible checkpoints of phase ``phase_index``, best first (nothing pending)."""
        out = self._ranked.get(phase_index)
        if out is None:
            search, seed, ties = self.search, self.seed, self._ties
            entries = {}
            for nid, ev in self._views.items():  # a stale view's node is eligible nowhere
                if self._eligible(tree, phase_index, ev):
                    known = ties.get(nid)
                    if known is not None and known[0] == ev.branches + ev.pending:
                        s = search(ev)
                        entries[nid] = (
                            -s if type(s) is float and s == s else key_of(search, ev, s),
                            known[1],
                            ev.tree_index,
                            nid,
                        )
                    else:
                        entries[nid] = entry(search, seed, ev)
            self._ties = {}
            out = self._ranked[phase_index] = sorted(entries.values())
            self._entries[phase_index] = entries
        return out
