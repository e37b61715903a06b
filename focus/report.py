"""Pictures and tables of a collection, for people looking at a run.

:func:`tree_png` draws the first few search trees: one panel per tree, checkpoints at
their depth, leaves coloured by kind (terminal with reward, truncated, failed), so one
can see at a glance where search spent its continuations. :func:`layout` is the pure
part (positions), separate from drawing so it can be tested without matplotlib.
matplotlib is imported only when drawing (it is in the ``examples`` extra).
"""

from __future__ import annotations

import io
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


def tree_png(trees: Sequence[Tree], max_trees: int = 6, dpi: int = 80) -> bytes:
    """A PNG with one panel per tree (at most ``max_trees``)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    shown = list(trees)[:max_trees]
    if not shown:
        return b""
    cols = min(3, len(shown))
    rows = (len(shown) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    try:
        for ax, tree in zip(axes.flat, shown, strict=False):
            pos = layout(tree)
            for e in tree.edges.values():
                (x0, y0), (x1, y1) = pos[e.parent], pos[e.child]
                ax.plot([x0, x1], [y0, y1], color="#999999", linewidth=0.8, zorder=1)
            for kind, colour in COLOURS.items():
                ids = [n.id for n in tree.nodes.values() if n.kind == kind]
                if kind == "terminal":
                    good = [i for i in ids if terminal_reward(tree, i) > 0]
                    bad = [i for i in ids if i not in set(good)]
                    _scatter(ax, pos, good, colour, "terminal, reward > 0", "o")
                    _scatter(ax, pos, bad, colour, "terminal, reward 0", "x")
                else:
                    _scatter(ax, pos, ids, colour, kind, "o")
            n_leaves = sum(1 for _ in tree.leaves())
            ax.set_title(f"{tree.task_id}: {len(tree.nodes)} nodes, {n_leaves} leaves", fontsize=8)
            ax.set_xticks([])
            ax.set_ylabel("depth", fontsize=7)
        for ax in list(axes.flat)[len(shown) :]:
            ax.axis("off")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=7, frameon=False)
        fig.tight_layout(rect=(0, 0.06, 1, 1))
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()
    finally:
        plt.close(fig)


def _scatter(
    ax: object, pos: dict[int, tuple[float, float]], ids: list[int], colour: str, label: str, marker: str
) -> None:
    if not ids:
        return
    xs = [pos[i][0] for i in ids]
    ys = [pos[i][1] for i in ids]
    ax.scatter(xs, ys, s=14, c=colour, marker=marker, label=label, zorder=2)  # type: ignore[attr-defined]
