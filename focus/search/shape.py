"""What the calibration and the plan's lead read of a tree's shape alone: its spreads,
its counts per truncation rule and its checkpoints' exploration draws, computed over
the whole tree or grown from an earlier tree's.

Grafting only adds: a grown tree holds its predecessor's edges and nodes, numbered
first, and new ones after them; an old node changes only by gaining children (and, at
a context limit or, the root, at a task's opening prompt over the context, losing its
branch state, ``focus.search.grafting``), and an old edge's
child keeps its kind. So a fact of an earlier tree is brought up to date from the new
edges and the checkpoints that gained a child alone: the same numbers as over the
whole tree (integer counts; the draws sorted), for the few nodes a graft touched
instead of all of them at every graft (at 40k transitions over 800 tasks, about 4,000
grafted trees of 50-60 nodes had their facts computed again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from focus.agent import CONTEXT_LIMIT
from focus.calibration import edge_counts, tree_counts
from focus.draws import explore_draw
from focus.refusals import opening_refusal
from focus.tree import Edge, Tree

#: Shape facts of an earlier form of a tree: key -> (fact, that tree's edge and node counts).
Known = dict[Any, tuple[Any, int, int]]


def tree_spreads(tree: Tree, keep: Callable[[Tree, Edge], bool] | None = None) -> int:
    """One tree's share of :meth:`focus.search.SearchState.spread_count`: checkpoints
    with two or more children that did not fail (of the segments ``keep`` accepts)."""
    children: dict[int, int] = {}
    for e in tree.edges.values():
        if (keep is None or keep(tree, e)) and tree.nodes[e.child].kind != "failed":
            children[e.parent] = children.get(e.parent, 0) + 1
    return sum(1 for c in children.values() if c >= 2)


def tree_draws(tree: Tree, index: int, nodes: Iterable[int] | None = None) -> list[tuple[float, int]]:
    """``(explore_draw, node id)`` of the next slot of each checkpoint with a branch state
    and a child (of ``nodes``, or of every checkpoint), unsorted."""
    ids = (n.id for n in tree.checkpoints()) if nodes is None else nodes
    out = []
    for i in ids:
        node = tree.nodes[i]
        if node.children and i in tree.states:
            out.append((explore_draw(index, i, len(node.children)), i))
    return out


class DepthChange:
    """What a graft changed in one tree's :data:`Depths`: the counts it grew from
    (``base``) and the two counts' differences (keys at 0 left out). The plan index adds
    the differences where it counted ``base`` (:meth:`focus.search.heads.PlanIndex.depth_counts`)
    instead of taking the tree's whole counts away and adding the new ones: a few keys
    a graft instead of every (depth, children) key of the tree four times. ``base`` is
    dropped once a later graft grows the counts again, so no tree holds a chain of them."""

    __slots__ = ("base", "open", "starts")

    def __init__(self, base: Depths, open_: dict[tuple[int, int], int], starts: dict[tuple[int, int], int]) -> None:
        self.base: Depths | None = base
        self.open, self.starts = open_, starts


#: What the depth-share bound reads of one tree: checkpoints with a branch state by
#: (depth, children), rollouts by (phase, depth they started at), the log's length, and
#: what the graft that grew them changed (``None`` for counts over the whole tree).
Depths = tuple[dict[tuple[int, int], int], dict[tuple[int, int], int], int, DepthChange | None]


def tree_depths(tree: Tree) -> Depths:
    """One tree's :data:`Depths` (``focus.search.depth_share``), over the whole tree."""
    nodes = tree.nodes
    open_: dict[tuple[int, int], int] = {}
    for nid in tree.states:
        node = nodes[nid]
        key = (node.depth, len(node.children))
        open_[key] = open_.get(key, 0) + 1
    starts: dict[tuple[int, int], int] = {}
    for rec in tree.log:
        key = (rec.phase, nodes[rec.node].depth)
        starts[key] = starts.get(key, 0) + 1
    return open_, starts, len(tree.log), None


def _grown_depths(tree: Tree, was: Depths, first: int, old_nodes: int) -> Depths:
    """:func:`tree_depths` of ``tree`` from an earlier form's (``first`` edges and
    ``old_nodes`` nodes): a graft adds nodes, edges and log records, and changes an old
    checkpoint only by giving it children, and its branch state is taken only where a
    new child is a turnless context-limit leaf, or the root's first refused opening
    prompt after children without a turn (``focus.search.grafting``)."""
    nodes, edges, states = tree.nodes, tree.edges, tree.states
    d_open: dict[tuple[int, int], int] = {}
    d_starts: dict[tuple[int, int], int] = {}
    for p in {edges[i].parent for i in range(first, len(edges))}:
        if p >= old_nodes:
            continue
        node = nodes[p]
        before = [i for i in node.children if i < first]
        had = p in states or (not _stateless(tree, p, before) and _stateless(tree, p, node.children))
        if had:
            count(d_open, (node.depth, len(before)), -1)
        if p in states:
            count(d_open, (node.depth, len(node.children)), 1)
    for nid in range(old_nodes, len(nodes)):
        if nid in states:
            count(d_open, (nodes[nid].depth, len(nodes[nid].children)), 1)
    for rec in tree.log[was[2] :]:
        count(d_starts, (rec.phase, nodes[rec.node].depth), 1)
    open_, starts = dict(was[0]), dict(was[1])
    for key, n in d_open.items():
        count(open_, key, n)
    for key, n in d_starts.items():
        count(starts, key, n)
    if was[3] is not None:
        was[3].base = None  # (the counts before ``was`` are no one's to add to now)
    return open_, starts, len(tree.log), DepthChange(was, d_open, d_starts)


def _stateless(tree: Tree, node_id: int, children: list[int]) -> bool:
    """Whether grafting took checkpoint ``node_id``'s branch state once it had the
    edges ``children`` (its first ones): one of them is :func:`_cut`, or it is the root
    and one of them was refused at the task's opening prompt, every one before it
    without a turn (:func:`focus.refusals.opening_refusal`)."""
    if any(_cut(tree, i) for i in children):
        return True
    if node_id != tree.ROOT or not children:
        return False
    return opening_refusal(tree, children) is not None


def _cut(tree: Tree, edge_id: int) -> bool:
    """Whether edge ``edge_id`` ends at a turnless context-limit leaf (its checkpoint's
    next prompt did not fit: grafting took that checkpoint's branch state)."""
    edge = tree.edges[edge_id]
    return not edge.turns and tree.nodes[edge.child].cause == CONTEXT_LIMIT


def count(counts: dict[tuple[int, int], int], key: tuple[int, int], n: int) -> None:
    """Add ``n`` to ``counts[key]``, dropping the key at 0 (so equal counts are equal dicts)."""
    left = counts.get(key, 0) + n
    if left:
        counts[key] = left
    else:
        del counts[key]


def shape_fact(tree: Tree, index: int, key: Any, known: Known | None) -> Any:
    """Fact ``key`` of tree ``index``: ``"spreads"`` (:func:`tree_spreads`), ``"draws"``
    (:func:`tree_draws`, smallest first), ``"depths"`` (:func:`tree_depths`) or a
    truncation rule (its :func:`focus.calibration.tree_counts`), grown from ``known``
    where that holds it."""
    hit = known.get(key) if known else None
    if hit is None:
        if key == "depths":
            return tree_depths(tree)
        if key == "spreads":
            return tree_spreads(tree)
        if key == "draws":
            return sorted(tree_draws(tree, index))
        return tree_counts(tree, key)
    was, first, old_nodes = hit
    if key == "depths":
        return _grown_depths(tree, was, first, old_nodes)
    new = [tree.edges[i] for i in range(first, len(tree.edges))]
    if key == "spreads":
        return was + _spread_change(tree, new, first, old_nodes)
    if key == "draws":
        grew = {e.parent for e in new}
        return sorted([d for d in was if d[1] not in grew] + tree_draws(tree, index, grew))
    return tuple(a + b for a, b in zip(was, edge_counts(tree, new, key), strict=True))


def known_shape(shape: dict[Any, Any], tree: Tree, known: Known | None) -> Known:
    """What a grown successor of ``tree`` knows of its shape: the facts in ``shape``
    (``tree``'s), or for those not computed, the earlier ones ``known``."""
    out = dict(known) if known else {}
    edges, nodes = len(tree.edges), len(tree.nodes)
    for key, fact in shape.items():
        out[key] = (fact, edges, nodes)
    return out


def _spread_change(tree: Tree, new: list[Edge], first: int, old_nodes: int) -> int:
    """How many more checkpoints have two or more children that did not fail with the
    edges ``new`` (ids ``first`` on) than without them."""
    nodes, edges = tree.nodes, tree.edges
    added: dict[int, int] = {}
    for e in new:
        if nodes[e.child].kind != "failed":
            added[e.parent] = added.get(e.parent, 0) + 1
    change = 0
    for p, n in added.items():
        before = 0
        if p < old_nodes:
            before = sum(1 for i in nodes[p].children if i < first and nodes[edges[i].child].kind != "failed")
        change += (before + n >= 2) - (before >= 2)
    return change
