"""The learning record's picture: per task, held-out success against cumulative task
transitions and against wall time, every seed faint and the median over seeds bold
(:func:`benchmarks.learning_verdicts.median_curve`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.learning_verdicts import METHODS, median_curve


def plot(runs: Sequence[dict[str, Any]], tasks: Sequence[str], path: Path) -> None:
    """Per task (a row): success against cumulative transitions, and against wall time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"focus": "tab:blue", "grpo": "tab:red", "uniform": "tab:green"}
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.2 * len(tasks)), squeeze=False)
    for row, task in enumerate(tasks):
        for col, (key, label) in enumerate((("transitions", "cumulative task transitions"), ("wall_s", "wall s"))):
            ax = axes[row][col]
            for m in METHODS:
                mine = [r for r in runs if r["task"] == task and r["method"] == m]
                for r in mine:
                    xs, ys = [p[key] for p in r["points"]], [p["success"] for p in r["points"]]
                    ax.plot(xs, ys, color=colors[m], alpha=0.2, linewidth=1)
                if mine:
                    xs, ys = zip(*median_curve(mine, key), strict=True)
                    ax.plot(xs, ys, color=colors[m], marker="o", linewidth=2.2, label=f"{m} (median of {len(mine)})")
            ax.set_xlabel(label)
            ax.set_ylabel("held-out success")
            ax.set_title(f"{task}: success vs {label}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
