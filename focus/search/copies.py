"""Copies of search trees: a private copy to edit in place (:func:`copy_tree`), and the
copy-on-write copies a graft or a scoring makes, which share every node they do not
change (:func:`cow_tree`, :func:`own`), so a wave costs in proportion to the nodes it
touched."""

from __future__ import annotations

from focus.tree import Node, Tree


def copy_tree(tree: Tree) -> Tree:
    """A copy that shares only immutable parts (edges, turns, branch states)."""
    nodes = {i: _node_copy(n) for i, n in tree.nodes.items()}
    return Tree(tree.task_id, nodes, dict(tree.edges), dict(tree.states), tree.rollouts, list(tree.log))


def cow_tree(tree: Tree) -> Tree:
    """A new tree object sharing nodes, edges, states and log records with ``tree``;
    a node is copied (:func:`own`) before it is changed."""
    return Tree(tree.task_id, dict(tree.nodes), dict(tree.edges), dict(tree.states), tree.rollouts, list(tree.log))


def own(tree: Tree, node_id: int, owned: set[int]) -> Node:
    """Node ``node_id`` of ``tree`` as a private copy, safe to change."""
    if node_id not in owned:
        node = tree.nodes[node_id]
        tree.nodes[node_id] = _node_copy(node)
        owned.add(node_id)
    return tree.nodes[node_id]


def _node_copy(node: Node) -> Node:
    """``dataclasses.replace(node, children=list(node.children))`` without re-running
    ``__init__`` field by field (``Node`` has no ``__post_init__``): grafting and scoring
    copy every node they change, about one per transition (1.9 against 0.5 us)."""
    new = _new(type(node))
    new.__dict__.update(node.__dict__)
    new.children = list(node.children)
    return new


_new = object.__new__
