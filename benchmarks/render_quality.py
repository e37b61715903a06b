"""README renderers of the estimation and learning benchmarks: estimator quality (the
project families and the held-out-style ones), learning curves and verdicts, waves."""

from __future__ import annotations

import math
import statistics
from typing import Any

from benchmarks.render_format import (
    code,
    each,
    num,
    s_,
    span,
    table,
    verdict,
    x_,
)

#: (summary key, what it compares, statistic the goal is on, goal as (op, value), goal text)
EQ_SUMMARY: tuple[tuple[str, str, str, tuple[str, float] | None, str], ...] = (
    ("selective_vs_grpo_noisy", "selective vs GRPO, noisy critics", "median", ("<=", 0.5), "<= 0.5"),
    ("selective_vs_uniform_noisy", "selective vs uniform branching, noisy critics", "median", ("<=", 0.8), "<= 0.8"),
    ("selective_vs_uniform_constant", "selective vs uniform, constant critic", "median", ("<=", 1.0), "<= 1.0"),
    ("selective_vs_uniform_all_cells", "selective vs uniform, every cell", "worst", ("<=", 1.1), "no cell > 1.1"),
    ("target_selective_vs_uniform_all_cells", "critic-target MSE, selective vs uniform, every cell", "median",
     ("<=", 1.0), "no worse than uniform (median)"),
    ("neutral_selective_vs_uniform_noisy", "composition-neutral error: selective vs uniform, noisy critics", "median",
     ("<=", 0.8), "<= 0.8"),
    ("neutral_selective_vs_uniform_constant", "composition-neutral error: selective vs uniform, constant critic",
     "median", ("<=", 1.0), "<= 1.0"),
    ("neutral_selective_vs_uniform_all_cells", "composition-neutral error: selective vs uniform, every cell", "worst",
     ("<=", 1.1), "no cell > 1.1"),
    ("selective_vs_grpo_constant", "selective vs GRPO, constant critic", "median", None, ""),
    ("selective_vs_node_mc_noisy", "selective vs per-node MC (VinePPO), noisy critics", "median", None, ""),
    ("selective_vs_node_mc_constant", "selective vs per-node MC, constant critic", "median", None, ""),
    ("uniform_vs_node_mc_noisy", "uniform + DirectBranchTd vs per-node MC, noisy critics", "worst", ("<=", 1.0),
     "never worse than MC"),
    ("uniform_vs_node_mc_constant", "uniform + DirectBranchTd vs per-node MC, constant critic", "worst", ("<=", 1.0),
     "never worse than MC"),
    ("selective_oldrank_vs_uniform_noisy", "ablation: old ranking vs uniform, noisy critics", "median", None, ""),
    ("selective_oldrank_vs_uniform_constant", "ablation: old ranking vs uniform, constant critic", "median", None, ""),
    ("selective_advonly_vs_uniform_noisy", "ablation: ranking advantages only vs uniform, noisy critics", "median",
     None, ""),
    ("selective_advonly_vs_uniform_constant", "ablation: ranking advantages only vs uniform, constant critic",
     "median", None, ""),
    ("target_selective_advonly_vs_uniform_all_cells",
     "ablation: critic-target MSE, ranking advantages only vs uniform, every cell", "median", None, ""),
    ("uniform_k1_vs_uniform_noisy", "ablation: kappa = 1 fixed vs fitted (uniform), noisy", "median", None, ""),
    ("uniform_k1_vs_uniform_constant", "ablation: kappa = 1 fixed vs fitted (uniform), constant", "median", None, ""),
)  # fmt: skip


EQ_METHODS = ("grpo", "node_mc", "uniform", "selective", "selective_oldrank", "selective_advonly", "uniform_k1")


def seed_spread(xs: list[Any]) -> str:
    """The per-seed medians: each of them for up to 12 seeds, else their range and
    quartiles (seeds a row did not run, NaN in the record, are left out)."""
    kept = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    if len(kept) <= 12:
        return each(kept, num)
    vals = sorted(kept)
    q = statistics.quantiles(vals, n=4)
    return f"{len(vals)} seeds: {num(vals[0])}-{num(vals[-1])}, quartiles {num(q[0])} / {num(q[1])} / {num(q[2])}"


def ablation_seeds(info: dict[str, Any]) -> str:
    n = info.get("ablation_seeds")
    return f" ({n} for the ablation rows)" if n is not None and n != info["seeds"] else ""


def seed_counts(info: dict[str, Any]) -> str:
    """The seed count, per budget where the record scales it with the budget."""
    by = info.get("seeds_by_budget")
    if not by or len(set(by.values())) == 1:
        return f"{info['seeds']} seeds"
    return ", ".join(f"{n} seeds at {b}H" for b, n in by.items())


def group_counts(above: dict[str, Any]) -> str:
    """The counts of cells above the bound in each group of 12 and of 4 seeds, as a
    phrase (records before the 48-seed default have the groups of 4 only)."""
    parts = [
        f"{size} seeds has {', '.join(str(n) for n in above[key])} cells above {above['bound']}"
        for size, key in ((12, "above_by_12_seed_group"), (4, "above_by_4_seed_group"))
        if key in above
    ]
    return ", into groups of ".join(parts)


def estimator_quality(f: dict[str, Any]) -> str:
    summary, per_seed, info = f["summary"], f["per_seed"], f["info"]
    rows = []
    for key, label, stat, goal, text in EQ_SUMMARY:
        if key not in summary:
            continue
        s = summary[key]
        worst = f"{num(s['worst'])} ({s['worst_cell']})"
        met = f"{text}: {verdict(s[stat], goal[1], goal[0])}" if goal else ""
        rows.append([label, f"**{num(s['median'])}**", worst, seed_spread(per_seed.get(key, [])), met])
    out = [
        f"{info['collections']:,} collections ({info['tasks']} tasks each, {seed_counts(info)}"
        f"{ablation_seeds(info)}, families "
        f"{', '.join(info['families'])}; budgets {', '.join(f'{b}H' for b in info['budgets'])}; "
        f"{info['jobs']} worker processes) in {s_(info['wall_s'])}.",
        table(["ratio of advantage MSE (median over cells)", "median", "worst cell", "per-seed medians", "goal"], rows),
    ]
    above = summary.get("selective_vs_uniform_all_cells", {}).get("above_1_1")
    if above:
        listed = "; ".join(
            f"{c['cell']} {c['ratio']:.3f}" + (f" ({num(c['low'])}-{num(c['high'])})" if c["low"] is not None else "")
            for c in above["above"]
        )
        out.append(
            f"Cells where selective is worse than {above['bound']}x uniform: {len(above['above'])} of "
            f"{above['cells']}{': ' + listed if listed else ''} (90% paired-bootstrap interval over the seeds). "
            f"Above {above['bound']} across the whole interval: {len(above['above_throughout'])}"
            f"{' (' + ', '.join(above['above_throughout']) + ')' if above['above_throughout'] else ''}. "
            f"The same run cut into groups of {group_counts(above)}."
        )
    neutral = summary.get("neutral_selective_vs_uniform_all_cells", {}).get("above_1_1")
    if neutral:
        out.append(_above(neutral, "Composition-neutral error"))
    out.append(
        "![selective / uniform per cell](results/estimator_quality.png)\n\n(Every cell's ratio, advantages above "
        "and critic targets below; blue: selective better, red: worse.)"
    )
    table_rows = {(r["family"], r["budget"], r["critic"], r["method"]): r for r in f["rows"]}
    cells = sorted({k[:3] for k in table_rows}, key=lambda k: (info["budgets"].index(k[1]), info["critics"].index(k[2]),
                                                              info["families"].index(k[0])))  # fmt: skip
    worse = [
        c
        for c in cells
        if (c + ("selective",)) in table_rows
        and (c + ("uniform",)) in table_rows
        and table_rows[c + ("selective",)]["target_mse"] > table_rows[c + ("uniform",)]["target_mse"]
    ]
    worse_10 = [
        c
        for c in worse
        if table_rows[c + ("selective",)]["target_mse"] > 1.1 * table_rows[c + ("uniform",)]["target_mse"]
    ]
    out.append(
        f"Critic-target MSE, selective against uniform: worse in {len(worse)} of {len(cells)} cells "
        f"({len(worse_10)} by more than 10%)."
    )
    budgets = info["budgets"][1:] if len(info["budgets"]) > 1 else info["budgets"]
    shown = [c for c in cells if c[1] in budgets and c[2] in ("noise_1", "constant")]
    names = {
        "grpo": "GRPO",
        "node_mc": "node MC",
        "selective_oldrank": "old ranking",
        "selective_advonly": "advantages only",
        "uniform_k1": "uniform, kappa = 1",
    }
    head = ["family", "budget", "critic", *(names.get(m, m) for m in EQ_METHODS), "selective / uniform"]
    mse_rows = []
    for c in shown:
        vals = [table_rows.get(c + (m,)) for m in EQ_METHODS]
        sel, uni = table_rows.get(c + ("selective",)), table_rows.get(c + ("uniform",))
        ratio = sel["adv_mse"] / uni["adv_mse"] if sel and uni and uni["adv_mse"] > 0 else None
        mse_rows.append([c[0], f"{c[1]}H", c[2], *(num(v["adv_mse"]) if v else "" for v in vals), num(ratio)])
    if mse_rows:
        out.append("Token-weighted advantage MSE, noise 1x and constant critic (every cell: the record's `rows`):")
        out.append(table(head, mse_rows))
    return "\n\n".join(out)


def _interval(d: dict[str, Any]) -> str:
    return f"{d['mean']:+.3f} [{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}]"


EQ_HELDOUT: tuple[tuple[str, str, str, tuple[str, float] | None, str], ...] = (
    ("neutral_selective_vs_uniform_noisy", "selective vs uniform, noisy critics", "median", ("<=", 0.8), "<= 0.8"),
    ("neutral_selective_vs_uniform_constant", "selective vs uniform, constant critic", "median", ("<=", 1.0),
     "<= 1.0"),
    ("neutral_selective_vs_grpo_noisy", "selective vs GRPO, noisy critics", "median", ("<=", 0.5), "<= 0.5"),
    ("neutral_selective_vs_uniform_depth_critics", "selective vs uniform, critics wrong by design", "median",
     None, ""),
    ("neutral_selective_vs_grpo_depth_critics", "selective vs GRPO, critics wrong by design", "median", None,
     ""),
    ("neutral_selective_vs_uniform_all_cells", "selective vs uniform, every cell", "worst", ("<=", 1.1),
     "no cell > 1.1"),
    ("selective_vs_uniform_noisy", "batch MSE: selective vs uniform, noisy critics", "median", ("<=", 0.8), "<= 0.8"),
    ("selective_vs_uniform_constant", "batch MSE: selective vs uniform, constant critic", "median", ("<=", 1.0),
     "<= 1.0"),
    ("selective_vs_grpo_noisy", "batch MSE: selective vs GRPO, noisy critics", "median", ("<=", 0.5), "<= 0.5"),
    ("selective_vs_uniform_depth_critics", "batch MSE: selective vs uniform, critics wrong by design",
     "median", None, ""),
    ("selective_vs_uniform_all_cells", "batch MSE: selective vs uniform, every cell", "worst", ("<=", 1.1),
     "no cell > 1.1"),
)  # fmt: skip


def _above(above: dict[str, Any], what: str) -> str:
    listed = "; ".join(
        f"{c['cell']} {c['ratio']:.3f}" + (f" ({num(c['low'])}-{num(c['high'])})" if c["low"] is not None else "")
        for c in above["above"]
    )
    return (
        f"{what}: cells where selective is worse than {above['bound']}x uniform: {len(above['above'])} of "
        f"{above['cells']}{': ' + listed if listed else ''} (90% paired-bootstrap interval over the seeds). "
        f"Above {above['bound']} across the whole interval: {len(above['above_throughout'])}"
        f"{' (' + ', '.join(above['above_throughout']) + ')' if above['above_throughout'] else ''}."
    )


def estimator_quality_heldout(f: dict[str, Any]) -> str:
    """The held-out-style families of issue 31: the composition-neutral error beside the
    batch MSE, the cells above 1.1x uniform on each, and the decisive step's share."""
    summary, per_seed, info = f["summary"], f["per_seed"], f["info"]
    rows = []
    for key, label, stat, goal, text in EQ_HELDOUT:
        if key not in summary:
            continue
        s = summary[key]
        met = f"{text}: {verdict(s[stat], goal[1], goal[0])}" if goal else ""
        rows.append([label, f"**{num(s['median'])}**", f"{num(s['worst'])} ({s['worst_cell']})",
                     seed_spread(per_seed.get(key, [])), met])  # fmt: skip
    out = [
        f"{info['collections']:,} collections ({info['tasks']} tasks each, {seed_counts(info)}, families "
        f"{', '.join(info['families'])}; critics {', '.join(info['critics'])}; budgets "
        f"{', '.join(f'{b}H' for b in info['budgets'])}; {info['jobs']} worker processes) in {s_(info['wall_s'])}.",
        table(
            [
                "ratio (median over cells; composition-neutral unless marked batch MSE)",
                "median",
                "worst cell",
                "per-seed medians",
                "goal",
            ],
            rows,
        ),  # fmt: skip
    ]
    for key, what in (("neutral_selective_vs_uniform_all_cells", "Composition-neutral error"),
                      ("selective_vs_uniform_all_cells", "Batch MSE")):  # fmt: skip
        above = summary.get(key, {}).get("above_1_1")
        if above:
            out.append(_above(above, what))
    table_rows = {(r["family"], r["budget"], r["critic"], r["method"]): r for r in f["rows"]}
    cells = sorted({k[:3] for k in table_rows}, key=lambda k: (info["budgets"].index(k[1]), info["critics"].index(k[2]),
                                                              info["families"].index(k[0])))  # fmt: skip
    head = ["family", "budget", "critic", "neutral: GRPO", "uniform", "selective", "sel/uni", "batch: sel/uni",
            "decisive share: uniform", "selective"]  # fmt: skip
    body = []
    for c in cells:
        g, u, sel = (table_rows.get(c + (m,)) for m in ("grpo", "uniform", "selective"))
        if not (u and sel):
            continue
        share = [x.get("decisive_share") for x in (u, sel)]
        body.append([
            c[0], f"{c[1]}H", c[2], num(g["neutral_mse"]) if g else "", num(u["neutral_mse"]), num(sel["neutral_mse"]),
            num(sel["neutral_mse"] / u["neutral_mse"]) if u["neutral_mse"] > 0 else "",
            num(sel["adv_mse"] / u["adv_mse"]) if u["adv_mse"] > 0 else "",
            *("" if x is None or x != x else num(x) for x in share),
        ])  # fmt: skip
    out.append("Every cell (seed means; neutral: the composition-neutral error):")
    out.append(table(head, body))
    return "\n\n".join(out)


def learning(f: dict[str, Any]) -> str:
    if "verdicts" not in f:
        return _learning_goals(f)
    v, runs = f["verdicts"], f["runs"]
    head = [
        "task", "method", "success v0", "final success, median [min, max]", "gain over v0, mean [95% interval]",
        "learns", "approx. KL per update, median / max", "invalid turns", "tokens trained", "transitions",
        "wall s", "CPU s",
    ]  # fmt: skip
    rows = []
    for task, t in v["tasks"].items():
        for m, g in t["gain"].items():
            mine = [r for r in runs if r["task"] == task and r["method"] == m]
            finals = [r["points"][-1]["success"] for r in mine]
            c = t["cost"][m]
            rows.append(
                [
                    task, m, f"{statistics.median(r['points'][0]['success'] for r in mine):.3f}",
                    f"{statistics.median(finals):.3f} [{min(finals):.3f}, {max(finals):.3f}]", _interval(g),
                    "yes" if g["learns"] else "no (within evaluation noise)",
                    f"{num(c['approx_kl_median'])} / {num(c['approx_kl_max'])}", f"{c['invalid_turn_rate']:.3f}",
                    f"{c['tokens_trained']:.0f}", f"{c['transitions']:.0f}", f"{c['wall_s']:.0f}", f"{c['cpu_s']:.0f}",
                ]
            )  # fmt: skip
    cmp_rows = []
    for task, t in v["tasks"].items():
        for m, c in t["vs_grpo"].items():
            per = ", ".join("never" if x is None else f"{x:.2f}" for x in c["share_per_seed"].values())
            share = "never" if c["share_median"] is None else f"{c['share_median']:.2f}"
            diffs = ", ".join(f"{x:+.3f}" for x in c["difference_per_seed"].values())
            verdict_text = c["verdict"] if c["verdict"] != "not judged" else "not judged (GRPO does not learn)"
            cmp_rows.append([task, m, f"{share} ({per})", f"{_interval(c['difference'])} ({diffs})", verdict_text])
    share = ("never" if v["judged_tasks"] else "n/a") if v["median_share"] is None else f"{v['median_share']:.2f}"
    sizes = f["sizes"]
    trainer = ", ".join(f"{k} {val}" for k, val in f["trainer"].items())
    for task, changed in f.get("trainer_per_task", {}).items():
        trainer += f"; {task}: " + ", ".join(f"{k} {val}" for k, val in changed.items())
    return "\n\n".join(
        [
            f"Seeds {each(f['seeds'])}; per task {sizes['iterations']} iterations x {sizes['tasks']} tasks, "
            f"{sizes['eval_tasks']} held out; {f['evidence_rollouts_per_task']} evidence rollouts per task; trainer "
            f"(every method): {trainer}."
            + (
                " **The run was stopped early; seeds per task (both methods finished):** "
                + "; ".join(f"{t} {each(ss)}" for t, ss in f["seeds_per_task"].items())
                + "."
                if "seeds_per_task" in f
                else ""
            ),
            table(head, rows),
            table(
                [
                    "task",
                    "method vs GRPO",
                    "share of GRPO's transitions to reach its final success, median (per seed)",
                    "final success difference, mean [95% interval] (per seed)",
                    "verdict",
                ],
                cmp_rows,
            ),  # fmt: skip
            f"Across the {v['judged_tasks']} judged tasks (GRPO learns): median share {share}; FOCUS better "
            f"(interval above 0) on {', '.join(v['focus_better_on']) or 'none'}; goal (median share <= 0.5 and "
            f"better on at least three tasks) {'met' if v['goal_met'] else '**missed**'}.",
            "![learning curves](results/learning.png)\n\n(Medians over the seeds as lines, seeds faint.)",
        ]
    )


def _learning_goals(f: dict[str, Any]) -> str:
    """Records before the verdicts (one toy/MATH goal per task), as they were rendered."""
    goals, runs = f["goals"], f["runs"]
    head = [
        "task",
        "method",
        "success v0",
        "final success, median [min, max] over seeds",
        "transitions",
        "wall s",
        "approx. KL per update, median / max",
        "transitions to GRPO's final / GRPO's",
    ]
    rows = []
    for task in goals:
        g = goals[task]
        for m in ("focus", "grpo", "uniform"):
            mine = [r for r in runs if r["task"] == task and r["method"] == m]
            if not mine:
                continue
            finals = [r["points"][-1]["success"] for r in mine]
            kls = [p["approx_kl"] for r in mine for p in r["points"][1:] if p.get("approx_kl") is not None]
            if not g["grpo_improved"]:
                reached = "n/a (GRPO did not improve)"
            elif m == "grpo":
                reached = "1.00"
            else:
                ratio = g.get(f"{m}_ratio")
                reached = "not reached" if ratio is None else f"{ratio:.2f}"
            rows.append(
                [
                    task,
                    m,
                    f"{statistics.median(r['points'][0]['success'] for r in mine):.3f}",
                    f"{statistics.median(finals):.3f} [{min(finals):.3f}, {max(finals):.3f}]",
                    f"{statistics.median(r['points'][-1]['transitions'] for r in mine):.0f}",
                    f"{statistics.median(r['points'][-1]['wall_s'] for r in mine):.0f}",
                    f"{num(statistics.median(kls)) if kls else 'n/a'} / {num(max(kls)) if kls else 'n/a'}",
                    reached,
                ]
            )
    goal_rows = []
    for task, g in goals.items():
        per = ", ".join(
            f"seed {s}: " + ("never" if v["focus_ratio"] is None else f"{v['focus_ratio']:.2f}")
            for s, v in g["per_seed"].items()
        )
        ratio = g["focus_ratio"]
        result = "never" if ratio is None else f"{ratio:.2f}"
        met = (
            "met" if g["goal_met"] else ("not judged: GRPO did not improve" if not g["grpo_improved"] else "**missed**")
        )
        goal_rows.append([task, f"{result} ({per})", met])
    sizes = "; ".join(f"{t}: {s['iterations']} iterations x {s['tasks']} tasks, {s['eval_tasks']} held out"
                      for t, s in f["sizes"].items())  # fmt: skip
    return "\n\n".join(
        [
            f"Seeds {each(f['seeds'])}; {sizes}.",
            table(head, rows),
            table(
                [
                    "task",
                    "FOCUS: share of GRPO's transitions to reach GRPO's final success, median (per seed)",
                    "goal <= 0.5",
                ],
                goal_rows,
            ),  # fmt: skip
            "![learning curves](results/learning.png)\n\n(Medians over the seeds as lines, seeds faint.)",
        ]
    )


def waves(f: dict[str, Any]) -> str:
    """benchmarks/waves.py: wave count, fill and lock-step occupancy of selective and
    uniform per variant and budget, the estimator-quality ratios of the same runs, and
    each variant's errors over the jobs-unit waves."""
    info, summary = f["info"], f["summary"]
    rows = []
    for v, per in summary.items():
        for b, d in per.items():
            s, u, r = d["means"]["selective"], d["means"]["uniform"], d["selective_vs_uniform"]
            rows.append(
                [
                    v, f"{b}H", f"{num(s['waves'])} / {num(u['waves'])}", f"**{x_(s['waves'] / u['waves'])}**",
                    f"{num(s['jobs_per_wave'])} / {num(u['jobs_per_wave'])}",
                    f"{num(s['transitions_per_wave'])} / {num(u['transitions_per_wave'])}",
                    f"{num(s['occupancy'])} / {num(u['occupancy'])}", x_(r["steps"]["median"]),
                    x_(r["adv_mse"]["median"]), x_(r["neutral_mse"]["median"]), x_(r["target_mse"]["median"]),
                ]
            )  # fmt: skip
    head = [
        "variant", "budget", "waves, sel / uni", "sel / uni waves", "jobs per wave", "transitions per wave",
        "server occupancy", "server steps, sel / uni", "adv MSE, sel / uni", "neutral MSE", "target MSE",
    ]  # fmt: skip
    top = max(summary["default"], key=int)
    fam = summary["default"][top]["waves_by_family"]
    ratio = max(d["selective"] / d["uniform"] for d in fam.values())
    mean = summary["default"][top]["means"]
    per_family = "; ".join(
        f"{code(v)}: "
        + ", ".join(f"{k} {num(d['selective'])} / {num(d['uniform'])}" for k, d in per[top]["waves_by_family"].items())
        for v, per in summary.items()
    )
    lines = [
        f"{len(info['families'])} families ({', '.join(info['families'])}), critics {', '.join(info['critics'])}, "
        f"{info['seeds']} seeds, {info['tasks']} tasks per collection, {info['collections']} collections; "
        f"server of {info['slots']} sequences. Means over families, critics and seeds; ratios of the errors are "
        "medians over cells (family x critic) of the seed means; variants: "
        + "; ".join(f"{code(v)} {code(str(p or 'library defaults'))}" for v, p in info["variants"].items())
        + ".",
        table(head, rows),
        f"Goal (library defaults, {top}H): selective's waves <= 1.5x uniform's: "
        f"{x_(mean['selective']['waves'] / mean['uniform']['waves'])} on the mean, {x_(ratio)} in the worst family "
        f"({verdict(ratio, 1.5, '<=')}). Waves per family at {top}H, selective / uniform: {per_family}.",
    ]
    versus = f.get("versus", {})
    if versus.get("ratios"):
        vrows = []
        for v, by in versus["ratios"].items():
            for m, per in by.items():
                for b, d in per.items():
                    vrows.append(
                        [
                            v,
                            m,
                            f"{b}H",
                            *(
                                f"{x_(d[k]['median'])} ({span(d[k]['each'], x_)})" if d[k] else "n/a"
                                for k in ("adv_mse", "neutral_mse", "target_mse")
                            ),
                        ]
                    )
        lines.append(
            f"Each variant's errors over the same method's with `{versus['base']}` waves (median over cells, and "
            "the range of the cells):\n\n"
            + table(["variant", "method", "budget", "adv MSE", "neutral MSE", "target MSE"], vrows)
        )
    return "\n\n".join(lines)
