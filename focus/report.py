"""Pictures of a collection, for people looking at a run.

:func:`tree_svg` draws the first few search trees: one panel per tree, nodes at their
depth, coloured by kind (checkpoint, terminal with or without reward, truncated,
failed), so one can see at a glance where search spent its continuations.
:func:`layout` is the pure part (positions).
"""

from __future__ import annotations

from collections.abc import Sequence

from focus.tree import Tree

COLOURS = {"checkpoint": "#4c72b0", "terminal": "#55a868", "truncated": "#dd8452", "failed": "#c44e52"}


def layout(tree: Tree) -> dict[int, tuple[float, float]]:
    """(x, y) of every node: leaves spread left to right in depth-first order, parents
    centred over their children, y = -depth."""
    pos: dict[int, tuple[float, float]] = {}
    next_x = 0.0

    def place(nid: int) -> float:
        nonlocal next_x
        node = tree.nodes[nid]
        kids = [tree.edges[e].child for e in node.children]
        if not kids:
            x = next_x
            next_x += 1.0
        else:
            xs = [place(k) for k in kids]
            x = (min(xs) + max(xs)) / 2
        pos[nid] = (x, -float(node.depth))
        return x

    place(Tree.ROOT)
    return pos


def terminal_reward(tree: Tree, node_id: int) -> float:
    """Discounted-free sum of rewards on the path from the root to ``node_id``."""
    return sum(sum(e.rewards) for e in tree.path_to(node_id))


def tree_svg(trees: Sequence[Tree], max_trees: int = 6, width: int = 360, height: int = 220) -> str:
    """An SVG with one panel per tree (at most ``max_trees``), written directly.

    Plain SVG text rather than a matplotlib figure: drawing a 10k-transition collection
    with matplotlib took about 4 s per flow run (more than the rest of the export); this
    takes milliseconds, and the Prefect UI shows it inline in a markdown artifact.
    """
    shown = list(trees)[:max_trees]
    cols = max(1, min(3, len(shown)))
    rows = (len(shown) + cols - 1) // cols
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * width}" height="{rows * height + 24}" '
        'font-family="sans-serif" font-size="10">'
    ]
    for k, tree in enumerate(shown):
        ox, oy = (k % cols) * width, (k // cols) * height
        pos = layout(tree)
        x_min = min(x for x, _ in pos.values())
        span = max(1.0, max(x for x, _ in pos.values()) - x_min)
        depth = max(1.0, -min(y for _, y in pos.values()))
        xy = {
            nid: (ox + 10 + (x - x_min) / span * (width - 20), oy + 24 + (-y) / depth * (height - 40))
            for nid, (x, y) in pos.items()
        }
        n_leaves = sum(1 for _ in tree.leaves())
        parts.append(
            f'<text x="{ox + 6}" y="{oy + 12}">{_esc(tree.task_id)}: {len(tree.nodes)} nodes, {n_leaves} leaves</text>'
        )
        for e in tree.edges.values():
            (x0, y0), (x1, y1) = xy[e.parent], xy[e.child]
            parts.append(
                f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="#999" stroke-width="0.7"/>'
            )
        for n in tree.nodes.values():
            x, y = xy[n.id]
            colour = COLOURS[n.kind]
            fill = "white" if n.kind == "terminal" and terminal_reward(tree, n.id) <= 0 else colour
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{fill}" stroke="{colour}"/>')
    legend = ["checkpoint", "terminal", "truncated", "failed"]
    for i, kind in enumerate(legend):
        x, y = 10 + i * 150, rows * height + 14
        label = "terminal (hollow: reward 0)" if kind == "terminal" else kind
        parts.append(
            f'<circle cx="{x}" cy="{y - 3}" r="4" fill="{COLOURS[kind]}"/><text x="{x + 8}" y="{y}">{label}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
