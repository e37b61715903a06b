"""Summaries of benchmarks/estimator_quality.py's runs: per-cell means over seeds, the
median and worst of a method's ratio to another over cells, the cells above 1.1x with
their paired-bootstrap intervals, and the picture of selective / uniform per cell."""

from __future__ import annotations

import math
import statistics
from typing import Any

from focus.synthetic_hard import DEPTH_CRITICS
from focus.synthetic_unseen import UNSEEN_CRITICS


def cell_ratio(num: float, den: float) -> float:
    """A ratio of two MSEs that tolerates both being exactly zero (an exact critic on a
    deterministic MDP)."""
    if den <= 1e-12:
        return 1.0 if num <= 1e-12 else math.inf
    return num / den


def summarise(
    rows: list[dict[str, Any]], families: list[str], budgets: list[int], critics: list[str], methods: list[str]
) -> dict[str, Any]:
    """Median and worst cell of each ratio over the rows given."""
    table = {(r["family"], r["budget"], r["critic"], r["method"]): r for r in rows}
    noisy = [c for c in critics if c.startswith("noise")]
    # critics wrong by design: systematic errors, not per-state noise
    by_depth = [c for c in critics if c in DEPTH_CRITICS or c in UNSEEN_CRITICS]

    def cells(method: str, other: str, crit: list[str], key: str = "adv_mse") -> list[tuple[float, str]]:
        out = []
        for f in families:
            for b in budgets:
                for c in crit:
                    a, o = table.get((f, b, c, method)), table.get((f, b, c, other))
                    if a is not None and o is not None and not math.isnan(a[key]) and not math.isnan(o[key]):
                        out.append((cell_ratio(a[key], o[key]), f"{f}/{b}H/{c}"))
        return out

    def stat(xs: list[tuple[float, str]]) -> dict[str, Any]:
        if not xs:
            return {"median": math.nan, "worst": math.nan, "worst_cell": None, "cells": 0}
        worst = max(xs)
        return {
            "median": statistics.median(x for x, _ in xs),
            "worst": worst[0],
            "worst_cell": worst[1],
            "cells": len(xs),
        }

    out: dict[str, Any] = {}
    if "selective" in methods:
        for other in ("grpo", "uniform", "node_mc"):
            if other in methods:
                out[f"selective_vs_{other}_noisy"] = stat(cells("selective", other, noisy))
                out[f"selective_vs_{other}_constant"] = stat(cells("selective", other, ["constant"]))
        if "uniform" in methods:
            out["selective_vs_uniform_all_cells"] = stat(cells("selective", "uniform", critics))
            out["target_selective_vs_uniform_all_cells"] = stat(cells("selective", "uniform", critics, "target_mse"))
        # the composition-neutral error (issue 31): the pairs every compared method has
        for other in ("grpo", "uniform", "node_mc"):
            if other in methods:
                out[f"neutral_selective_vs_{other}_noisy"] = stat(cells("selective", other, noisy, "neutral_mse"))
                out[f"neutral_selective_vs_{other}_constant"] = stat(
                    cells("selective", other, ["constant"], "neutral_mse")
                )
                if by_depth:
                    out[f"selective_vs_{other}_depth_critics"] = stat(cells("selective", other, by_depth))
                    out[f"neutral_selective_vs_{other}_depth_critics"] = stat(
                        cells("selective", other, by_depth, "neutral_mse")
                    )
        if "uniform" in methods:
            out["neutral_selective_vs_uniform_all_cells"] = stat(cells("selective", "uniform", critics, "neutral_mse"))
        for abl in ("selective_oldrank", "selective_advonly"):
            if abl in methods:
                out[f"{abl}_vs_uniform_noisy"] = stat(cells(abl, "uniform", noisy))
                out[f"{abl}_vs_uniform_constant"] = stat(cells(abl, "uniform", ["constant"]))
                out[f"target_{abl}_vs_uniform_all_cells"] = stat(cells(abl, "uniform", critics, "target_mse"))
    if "uniform" in methods and "node_mc" in methods:
        out["uniform_vs_node_mc_noisy"] = stat(cells("uniform", "node_mc", noisy))
        out["uniform_vs_node_mc_constant"] = stat(cells("uniform", "node_mc", ["constant"]))
    if "uniform_k1" in methods and "uniform" in methods:
        out["uniform_k1_vs_uniform_noisy"] = stat(cells("uniform_k1", "uniform", noisy))
        out["uniform_k1_vs_uniform_constant"] = stat(cells("uniform_k1", "uniform", ["constant"]))
    return out


def cells_above(
    raw: list[dict[str, Any]], method: str, other: str, bound: float = 1.1, draws: int = 1000, key: str = "adv_mse"
) -> dict[str, Any]:
    """The cells whose ``method``/``other`` ratio of seed-mean advantage MSE exceeds
    ``bound``, each with a 90% paired-bootstrap interval over the seeds both methods ran
    in that cell; the cells whose interval lies above ``bound``; and the count above
    ``bound`` in each disjoint group of 4 and of 12 seeds (what a run of that many seeds
    would have reported; as many groups as the cell with the fewest seeds has).
    Deterministic (a fixed generator)."""
    import random

    mse: dict[tuple[str, int, str, str], dict[int, float]] = {}
    for r in raw:
        if not math.isnan(r[key]):
            mse.setdefault((r["family"], r["budget"], r["critic"], r["method"]), {})[r["seed"]] = r[key]
    cells = sorted({k[:3] for k in mse if k[3] == method and k[:3] + (other,) in mse})
    seeds = {c: sorted(mse[c + (method,)].keys() & mse[c + (other,)].keys()) for c in cells}

    def ratio(cell: tuple[str, int, str], ss: list[int]) -> float:
        a, o = mse[cell + (method,)], mse[cell + (other,)]
        return cell_ratio(statistics.fmean(a[s] for s in ss), statistics.fmean(o[s] for s in ss))

    rng = random.Random(0)
    above = []
    for cell in cells:
        ss = seeds[cell]
        point = ratio(cell, ss)
        if point <= bound:
            continue
        lo = hi = None  # fewer than 4 seeds: no interval worth the name
        if len(ss) >= 4:
            boot = sorted(ratio(cell, [rng.choice(ss) for _ in ss]) for _ in range(draws))
            lo, hi = boot[int(0.05 * draws)], boot[int(0.95 * draws) - 1]
        above.append(
            {"cell": f"{cell[0]}/{cell[1]}H/{cell[2]}", "ratio": point, "low": lo, "high": hi, "seeds": len(ss)}
        )
    above.sort(key=lambda c: -c["ratio"])
    fewest = min((len(ss) for ss in seeds.values()), default=0)

    def by_groups(size: int) -> list[int]:
        return [sum(ratio(c, seeds[c][i : i + size]) > bound for c in cells) for i in range(0, fewest - size + 1, size)]

    return {
        "bound": bound,
        "cells": len(cells),
        "above": above,
        "above_throughout": [c["cell"] for c in above if c["low"] is not None and c["low"] > bound],
        "above_by_4_seed_group": by_groups(4),
        "above_by_12_seed_group": by_groups(12),
    }


def plot(rows: list[dict[str, Any]], above: dict[str, Any] | None, path: str) -> None:
    """Selective / uniform per cell, advantages and critic targets, as two heat maps
    (families down, budget x critic across; blue: selective better, red: worse, on a
    log scale from 0.5x to 2x). Cells above 1.1x are outlined, and marked ``*`` where
    they stay above 1.1 across their 90% interval over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    table = {(r["family"], r["budget"], r["critic"], r["method"]): r for r in rows}
    families = list(dict.fromkeys(r["family"] for r in rows))
    budgets = sorted({r["budget"] for r in rows})
    critics = list(dict.fromkeys(r["critic"] for r in rows))
    cols = [(b, c) for b in budgets for c in critics]
    sure = set(above["above_throughout"]) if above else set()
    fig, axes = plt.subplots(2, 1, figsize=(1.0 + 0.62 * len(cols), 1.6 + 0.95 * len(families)), squeeze=False)
    for ax, (key, what) in zip(axes[:, 0], (("adv_mse", "advantage"), ("target_mse", "critic-target")), strict=True):
        grid = [[math.nan] * len(cols) for _ in families]
        for i, f in enumerate(families):
            for j, (b, c) in enumerate(cols):
                sel, uni = table.get((f, b, c, "selective")), table.get((f, b, c, "uniform"))
                if sel and uni:
                    grid[i][j] = min(max(cell_ratio(sel[key], uni[key]), 1e-3), 1e3)
        image = ax.imshow(grid, cmap="RdBu_r", norm=LogNorm(vmin=0.5, vmax=2.0), aspect="auto")
        for i, f in enumerate(families):
            for j, (b, c) in enumerate(cols):
                v = grid[i][j]
                if math.isnan(v):
                    continue
                mark = "*" if key == "adv_mse" and f"{f}/{b}H/{c}" in sure else ""
                ax.text(j, i, f"{v:.2f}{mark}", ha="center", va="center", fontsize=7)
                if v > 1.1:
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", lw=1.5))
        ax.set_xticks(range(len(cols)), [f"{b}H\n{c.replace('noise_', 'noise ')}" for b, c in cols], fontsize=7)
        ax.set_yticks(range(len(families)), families, fontsize=8)
        for k in range(1, len(budgets)):
            ax.axvline(k * len(critics) - 0.5, color="black", lw=1)
        ax.set_title(f"selective / uniform, {what} MSE per cell (outlined: above 1.1x; *: above it across the 90% interval)",
                     fontsize=9)  # fmt: skip
        bar = fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01)
        bar.set_ticks([0.5, 0.7, 1.0, 1.4, 2.0], labels=["0.5x", "0.7x", "1x", "1.4x", "2x"])
        bar.ax.minorticks_off()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def mean_rows(raw: list[dict[str, Any]], seeds: list[int]) -> list[dict[str, Any]]:
    """Per (family, budget, critic, method): the metrics averaged over ``seeds``."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in raw:
        if r["seed"] in seeds:
            groups.setdefault((r["family"], r["budget"], r["critic"], r["method"]), []).append(r)
    out = []
    for (f, b, c, m), rs in groups.items():
        row: dict[str, Any] = {"family": f, "budget": b, "critic": c, "method": m}
        for k in ("adv_mse", "sign_agreement", "target_mse", "transitions", "tokens", "neutral_mse", "decisive_share"):
            xs = [r[k] for r in rs if r.get(k) is not None and not math.isnan(r[k])]
            row[k] = statistics.fmean(xs) if xs else math.nan
        out.append(row)
    return out
