"""Reading learning curves into verdicts (pure arithmetic; no model, no clock).

A run is ``{"task", "method", "seed", "points": [...], "outcomes": {...}}``: one point
per policy version (``transitions``, ``wall_s``, ``cpu_s``, ``success``) and, for the
first and the last version, the held-out outcomes task by task (``"0110..."``, the
same tasks and sampling seeds for every method at a seed: the evaluations are paired).

Intervals are percentile bootstraps that resample what varies: seeds, and inside a
seed the held-out tasks (a hierarchical, paired bootstrap). A method *learns* on a
task when the interval of its gain over v0 lies above 0; a comparison with a
baseline that does not learn is *not judged* (its final success is v0's give or
take evaluation noise, and reaching it says nothing).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

METHODS = ("focus", "grpo", "uniform")
#: Bootstrap resamples; the interval's digits are stable to about 0.005 at this count.
RESAMPLES = 2000
LEVEL = 0.95


def median_curve(runs: Sequence[dict[str, Any]], key: str = "transitions") -> list[tuple[float, float]]:
    """(median x, median success) per version over the runs (seeds) of one method."""
    n = min(len(r["points"]) for r in runs)
    return [
        (
            statistics.median(r["points"][v][key] for r in runs),
            statistics.median(r["points"][v]["success"] for r in runs),
        )
        for v in range(n)
    ]


def reach(curve: Sequence[tuple[float, float]], level: float) -> float | None:
    """The x at which ``curve`` first reaches ``level`` (linear between points)."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if y0 >= level:
            return x0
        if y1 >= level:
            return x0 + (x1 - x0) * (level - y0) / (y1 - y0)
    return curve[-1][0] if curve and curve[-1][1] >= level else None


def paired_bootstrap(
    pairs: Sequence[tuple[str, str]], resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL
) -> tuple[float, float, float]:
    """Mean over seeds of (success of ``b`` - success of ``a``), and its interval.

    ``pairs``: per seed, two equally long 0/1 strings over the same held-out tasks.
    Each resample draws seeds with replacement, and inside each drawn seed the task
    indices with replacement (the same indices for ``a`` and ``b``: paired).
    """
    if not pairs:
        raise ValueError("no pairs to bootstrap")
    import numpy as np

    if len({len(a) for a, _ in pairs}) != 1 or any(len(a) != len(b) or not a for a, b in pairs):
        raise ValueError("paired outcomes must be equally long and not empty")
    diff = np.array([[int(y) - int(x) for x, y in zip(a, b, strict=True)] for a, b in pairs], dtype=float)
    n_seeds, n_tasks = diff.shape
    point = float(diff.mean())
    rng = np.random.default_rng(seed)
    seeds = rng.integers(n_seeds, size=(resamples, n_seeds))
    tasks = rng.integers(n_tasks, size=(resamples, n_seeds, n_tasks))
    stats = np.sort(diff[seeds[:, :, None], tasks].mean(axis=(1, 2)))
    lo = float(stats[int((1 - level) / 2 * resamples)])
    hi = float(stats[min(resamples - 1, int((1 + level) / 2 * resamples))])
    return point, lo, hi


def _by_seed(runs: Sequence[dict[str, Any]], task: str, method: str) -> dict[int, dict[str, Any]]:
    return {r["seed"]: r for r in runs if r["task"] == task and r["method"] == method}


def gain(runs: Sequence[dict[str, Any]], task: str, method: str) -> dict[str, Any]:
    """A method's gain over v0 on ``task``: per seed, the mean with its interval, and
    whether it learns (interval above 0)."""
    mine = _by_seed(runs, task, method)
    pairs = [(r["outcomes"]["first"], r["outcomes"]["last"]) for r in mine.values()]
    mean, lo, hi = paired_bootstrap(pairs)
    per_seed = {s: round(r["points"][-1]["success"] - r["points"][0]["success"], 6) for s, r in mine.items()}
    return {"per_seed": per_seed, "mean": round(mean, 6), "interval": [round(lo, 6), round(hi, 6)], "learns": lo > 0}


def compare(runs: Sequence[dict[str, Any]], task: str, method: str, baseline: str = "grpo") -> dict[str, Any]:
    """``method`` against ``baseline`` on ``task``, paired by seed.

    ``share``: the transitions ``method`` needs to reach the baseline's final success,
    as a share of the baseline's, per seed (None: never) and their median (a seed that
    never reaches it counts as infinitely late); ``share_median_curves``: the same read
    off the median curves. ``reach_ratio``: the transitions ``method`` needs to reach the
    baseline's final success over the transitions the baseline itself first reached it
    at, per seed (None: never; seeds where the baseline ends at its v0's success left
    out) and median (a never counting as infinitely late) - the
    share counts the baseline's whole run, so two equal methods that level off early
    read below 1 by it, not by this. ``difference``: final success minus the baseline's, per
    seed, and the mean with its interval. ``verdict``: ``better`` / ``worse`` (interval
    above / below 0), ``no difference``, or ``not judged`` when the baseline does not
    learn.
    """
    mine, base = _by_seed(runs, task, method), _by_seed(runs, task, baseline)
    seeds = sorted(set(mine) & set(base))
    shares: dict[int, float | None] = {}
    ratios: dict[int, float | None] = {}
    for s in seeds:
        b = base[s]["points"]
        x = reach([(p["transitions"], p["success"]) for p in mine[s]["points"]], b[-1]["success"])
        shares[s] = None if x is None or b[-1]["transitions"] <= 0 else round(x / b[-1]["transitions"], 6)
        own = reach([(p["transitions"], p["success"]) for p in b], b[-1]["success"])
        if own:  # a seed where GRPO ends at its v0's success has no time to compare with
            ratios[s] = None if x is None else round(x / own, 6)
    finite = sorted(v if v is not None else float("inf") for v in shares.values())
    share_median = statistics.median(finite) if finite else None
    bcurve = median_curve([base[s] for s in seeds])
    x = reach(median_curve([mine[s] for s in seeds]), bcurve[-1][1])
    pairs = [(base[s]["outcomes"]["last"], mine[s]["outcomes"]["last"]) for s in seeds]
    mean, lo, hi = paired_bootstrap(pairs)
    learns = gain(runs, task, baseline)["learns"]
    verdict = "not judged" if not learns else ("better" if lo > 0 else "worse" if hi < 0 else "no difference")
    return {
        "share_per_seed": shares,
        "share_median": None if share_median is None or share_median == float("inf") else round(share_median, 6),
        "reach_ratio_per_seed": ratios,
        "reach_ratio_median": _median_or_none(ratios.values()),
        "share_median_curves": None if x is None or bcurve[-1][0] <= 0 else round(x / bcurve[-1][0], 6),
        "difference_per_seed": {
            s: round(mine[s]["points"][-1]["success"] - base[s]["points"][-1]["success"], 6) for s in seeds
        },
        "difference": {"mean": round(mean, 6), "interval": [round(lo, 6), round(hi, 6)]},
        "baseline_learns": learns,
        "verdict": verdict,
    }


def verdicts(runs: Sequence[dict[str, Any]], tasks: Sequence[str]) -> dict[str, Any]:
    """Per task: every method's gain, FOCUS and uniform against GRPO, cost per method;
    across tasks: the median share (judged tasks only) and the tasks FOCUS wins."""
    per_task: dict[str, Any] = {}
    for task in tasks:
        methods = [m for m in METHODS if _by_seed(runs, task, m)]
        per_task[task] = {
            "gain": {m: gain(runs, task, m) for m in methods},
            "vs_grpo": {m: compare(runs, task, m) for m in methods if m != "grpo" and "grpo" in methods},
            "cost": {m: cost(runs, task, m) for m in methods},
        }
    judged = [
        v["vs_grpo"]["focus"]
        for v in per_task.values()
        if "focus" in v["vs_grpo"] and v["vs_grpo"]["focus"]["baseline_learns"]
    ]
    shares = sorted(c["share_median"] if c["share_median"] is not None else float("inf") for c in judged)
    median_share = statistics.median(shares) if shares else None
    wins = [t for t, v in per_task.items() if v["vs_grpo"].get("focus", {}).get("verdict") == "better"]
    return {
        "tasks": per_task,
        "judged_tasks": len(judged),
        "median_share": None if median_share is None or median_share == float("inf") else round(median_share, 6),
        "focus_better_on": wins,
        "goal_met": median_share is not None and median_share <= 0.5 and len(wins) >= 3,
    }


def _median_or_none(values: Any) -> float | None:
    """The median, a None counting as infinitely late; None when that median is."""
    finite = sorted(v if v is not None else float("inf") for v in values)
    m = statistics.median(finite) if finite else float("inf")
    return None if m == float("inf") else round(m, 6)


def cost(runs: Sequence[dict[str, Any]], task: str, method: str) -> dict[str, float]:
    """Medians over seeds of the last point's transitions, wall and CPU seconds, and of
    the per-update KL, invalid-turn rate and tokens trained."""
    mine = list(_by_seed(runs, task, method).values())
    last = [r["points"][-1] for r in mine]
    updates = [p for r in mine for p in r["points"][1:]]

    def med(values: list[float]) -> float:
        return round(statistics.median(values), 6) if values else 0.0

    return {
        "transitions": med([p["transitions"] for p in last]),
        "wall_s": med([p["wall_s"] for p in last]),
        "cpu_s": med([p.get("cpu_s", 0.0) for p in last]),
        "approx_kl_median": med([p["approx_kl"] for p in updates]),
        "approx_kl_max": round(max((p["approx_kl"] for p in updates), default=0.0), 6),
        "invalid_turn_rate": med([p.get("invalid_rate", 0.0) for p in last]),
        "tokens_trained": med([float(sum(p["tokens_trained"] for p in r["points"][1:])) for r in mine]),
    }


def summary(result: dict[str, Any]) -> str:
    """Lines a person reads: per task the gains, FOCUS against GRPO, and across tasks."""
    v = result["verdicts"]
    lines = []
    for task, t in v["tasks"].items():
        gains = ", ".join(
            f"{m} {g['mean']:+.3f} [{g['interval'][0]:+.3f}, {g['interval'][1]:+.3f}]{'' if g['learns'] else ' (no)'}"
            for m, g in t["gain"].items()
        )
        lines.append(f"{task}: gain over v0 {gains}")
        for m, c in t["vs_grpo"].items():
            d = c["difference"]
            share = "never" if c["share_median"] is None else f"{c['share_median']:.2f}"
            lines.append(
                f"  {m} vs grpo: {c['verdict']}; final difference {d['mean']:+.3f} "
                f"[{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}]; share of GRPO's transitions {share}"
            )
    share = ("never" if v["judged_tasks"] else "n/a") if v["median_share"] is None else f"{v['median_share']:.2f}"
    lines.append(
        f"across {v['judged_tasks']} judged tasks: median share {share}; FOCUS better on "
        f"{', '.join(v['focus_better_on']) or 'none'}; goal {'met' if v['goal_met'] else 'not met'}"
    )
    return "\n".join(lines)
