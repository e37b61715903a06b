"""Pictures of a collection, for people looking at a run.

:func:`tree_svg` draws the first few search trees: one panel per tree, nodes at their
depth, each node coloured by its refined value ``V(n)`` and each segment by its
advantage ``A(e)`` (the two numbers the batch's learning signal is made of, computed by
the collection's estimator), with a legend of both scales and of the node shapes.
The picture carries its own background and text colours, so it reads the same in a
light or a dark user interface (Prefect's UI opens dark). :func:`layout` is the pure
part (positions); the colour scales are pure functions too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from focus.tree import Tree

BACKGROUND = "#ffffff"
TEXT = "#1f2328"
MUTED = "#8c959f"
FAILED = "#cf222e"
#: Sequential scale for values (viridis, colour-blind safe), low to high.
VALUE_SCALE = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")
#: Diverging scale for advantages: negative blue, zero grey, positive orange.
ADVANTAGE_SCALE = ("#2166ac", "#92c5de", "#d9d9d9", "#f4a582", "#b2182b")
#: Characters XML 1.0 does not allow (C0 controls but tab, newline and return; lone
#: surrogates; U+FFFE, U+FFFF): one in a task id made the whole picture unreadable.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
#: The most characters of a task id a panel's title shows (a panel is 360 px wide).
TITLE_CHARS = 48


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


def _mix(a: str, b: str, t: float) -> str:
    ca = [int(a[i : i + 2], 16) for i in (1, 3, 5)]
    cb = [int(b[i : i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(ca, cb, strict=True))


def scale_colour(scale: Sequence[str], t: float) -> str:
    """The colour at ``t`` in [0, 1] of a scale given by evenly spaced anchors."""
    t = min(max(t, 0.0), 1.0) * (len(scale) - 1)
    i = min(int(t), len(scale) - 2)
    return _mix(scale[i], scale[i + 1], t - i)


def value_colour(v: float, lo: float, hi: float) -> str:
    return scale_colour(VALUE_SCALE, 0.5 if hi <= lo else (v - lo) / (hi - lo))


def advantage_colour(a: float, bound: float) -> str:
    """Symmetric around zero, so grey always means "no better or worse than expected"."""
    return scale_colour(ADVANTAGE_SCALE, 0.5 if bound <= 0 else 0.5 + a / (2 * bound))


def tree_signals(tree: Tree, estimator: Any = None) -> tuple[dict[int, float | None], dict[int, float]]:
    """Refined value per node and advantage per segment, as the estimator gives them
    (default :class:`focus.estimation.DirectBranchTd`); nodes and segments it leaves
    out (failed leaves, unknown values) are ``None`` or missing."""
    from focus.estimation import DirectBranchTd

    est = estimator if estimator is not None else DirectBranchTd()
    values = est.values(tree)
    return dict(values.value), est.advantages(list(tree.edges.values()), values)


def tree_svg(
    trees: Sequence[Tree],
    max_trees: int = 6,
    width: int = 360,
    height: int = 220,
    *,
    estimator: Any = None,
) -> str:
    """An SVG with one panel per tree (at most ``max_trees``), written directly.

    Plain SVG text rather than a matplotlib figure: drawing a 10k-transition collection
    with matplotlib took about 4 s per flow run (more than the rest of the export); this
    takes milliseconds, and the Prefect UI shows it inline in a markdown artifact.
    """
    shown = list(trees)[:max_trees]
    signals = [tree_signals(t, estimator) for t in shown]
    vals = [v for vs, _ in signals for v in vs.values() if v is not None]
    advs = [a for _, adv in signals for a in adv.values()]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    bound = max((abs(a) for a in advs), default=0.0)
    cols = max(1, min(3, len(shown)))
    rows = (len(shown) + cols - 1) // cols
    legend_h = 74
    w, h = max(cols * width, 720), rows * height + legend_h
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        f'font-family="sans-serif" font-size="10" fill="{TEXT}">',
        f'<rect x="0" y="0" width="{w}" height="{h}" rx="6" fill="{BACKGROUND}"/>',
    ]
    for k, (tree, (value, adv)) in enumerate(zip(shown, signals, strict=True)):
        ox, oy = (k % cols) * width, (k // cols) * height
        pos = layout(tree)
        x_min = min(x for x, _ in pos.values())
        span = max(1.0, max(x for x, _ in pos.values()) - x_min)
        depth = max(1.0, -min(y for _, y in pos.values()))
        xy = {
            nid: (ox + 12 + (x - x_min) / span * (width - 24), oy + 26 + (-y) / depth * (height - 44))
            for nid, (x, y) in pos.items()
        }
        n_leaves = sum(1 for _ in tree.leaves())
        parts.append(
            f'<text x="{ox + 8}" y="{oy + 14}" fill="{TEXT}">{_esc(tree.task_id, TITLE_CHARS)}: '
            f"{len(tree.nodes)} nodes, {n_leaves} leaves</text>"
        )
        for e in tree.edges.values():
            (x0, y0), (x1, y1) = xy[e.parent], xy[e.child]
            a = adv.get(e.id)
            style = (
                f'stroke="{advantage_colour(a, bound)}" stroke-width="1.6"'
                if a is not None
                else f'stroke="{MUTED}" stroke-width="0.8" stroke-dasharray="2,2"'
            )
            parts.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" {style}/>')
        for n in tree.nodes.values():
            x, y = xy[n.id]
            parts.append(_node(n.kind, x, y, value.get(n.id), lo, hi))
    parts += _legend(rows * height + 8, lo, hi, bound)
    parts.append("</svg>")
    return "".join(parts)


def _node(kind: str, x: float, y: float, v: float | None, lo: float, hi: float, r: float = 3.2) -> str:
    if kind == "failed":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{BACKGROUND}" stroke="{FAILED}" stroke-width="1.4"/>'
    fill = value_colour(v, lo, hi) if v is not None else BACKGROUND
    edge = f'stroke="{TEXT}" stroke-width="0.6"' if v is not None else f'stroke="{MUTED}" stroke-width="1"'
    if kind == "checkpoint":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" {edge}/>'
    if kind == "truncated":
        pts = f"{x:.1f},{y - r - 0.6:.1f} {x - r - 0.6:.1f},{y + r:.1f} {x + r + 0.6:.1f},{y + r:.1f}"
        return f'<polygon points="{pts}" fill="{fill}" {edge}/>'
    return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r}" height="{2 * r}" fill="{fill}" {edge}/>'


def _gradient(x: float, y: float, scale: Sequence[str], w: float = 120, h: float = 9, steps: int = 24) -> list[str]:
    return [
        f'<rect x="{x + i * w / steps:.1f}" y="{y}" width="{w / steps + 0.4:.1f}" height="{h}" '
        f'fill="{scale_colour(scale, i / (steps - 1))}"/>'
        for i in range(steps)
    ]


def _legend(y: float, lo: float, hi: float, bound: float) -> list[str]:
    """Both colour scales with their ranges, and the node shapes."""
    out = [f'<text x="10" y="{y + 10}" fill="{TEXT}" font-weight="bold">node colour: refined value V(n)</text>']
    out += _gradient(10, y + 16, VALUE_SCALE)
    out.append(f'<text x="10" y="{y + 38}" fill="{TEXT}">{lo:.3g}</text>')
    out.append(f'<text x="130" y="{y + 38}" fill="{TEXT}" text-anchor="end">{hi:.3g}</text>')
    ax = 230
    out.append(f'<text x="{ax}" y="{y + 10}" fill="{TEXT}" font-weight="bold">edge colour: advantage A(e)</text>')
    out += _gradient(ax, y + 16, ADVANTAGE_SCALE)
    out.append(f'<text x="{ax}" y="{y + 38}" fill="{TEXT}">{-bound:.3g}</text>')
    out.append(f'<text x="{ax + 60}" y="{y + 38}" fill="{TEXT}" text-anchor="middle">0</text>')
    out.append(f'<text x="{ax + 120}" y="{y + 38}" fill="{TEXT}" text-anchor="end">{bound:.3g}</text>')
    sx = 450
    out.append(f'<text x="{sx}" y="{y + 10}" fill="{TEXT}" font-weight="bold">shape</text>')
    mid = (lo + hi) / 2
    for i, (kind, label) in enumerate(
        [
            ("checkpoint", "checkpoint"),
            ("terminal", "terminal leaf"),
            ("truncated", "truncated leaf"),
            ("failed", "failed leaf"),
        ]
    ):
        cx, cy = sx + 6 + (i % 2) * 110, y + 22 + (i // 2) * 16
        out.append(_node(kind, cx, cy, mid, lo, hi, r=4))
        out.append(f'<text x="{cx + 9}" y="{cy + 3.5}" fill="{TEXT}">{label}</text>')
    out.append(
        f'<text x="10" y="{y + 60}" fill="{MUTED}">dashed grey edge: no advantage (failed or unvalued segment); '
        "hollow node: no value</text>"
    )
    return out


def _esc(text: str, most: int | None = None) -> str:
    """``text`` as XML character data, cut to ``most`` characters (with an ellipsis).
    A task id is the user's string: a NUL or another control character in one made the
    SVG ill-formed (no viewer draws it), and a 5,000-character id ran over every panel."""
    text = _NOT_XML.sub("\ufffd", text).replace("\t", " ").replace("\n", " ").replace("\r", " ")
    if most is not None and len(text) > most:
        text = text[: most - 1] + "\u2026"
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
