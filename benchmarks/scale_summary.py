"""The summary of benchmarks/scale.py: the ratios its goals name, whether they are met,
and the tables it prints, from the rows of a run (each arm's median run).
"""

from __future__ import annotations

from typing import Any

#: The goals (cost per transition flat as collections grow), all checked against figures of one run.
GOALS = {
    "focus_vs_baseline_cpu_per_transition": 1.3,  # at every row
    "focus_cpu_per_transition_vs_smallest": 1.2,  # at every size, per task series
    "plan_cpu_per_wave_last_vs_first_quarter": 1.5,  # at the largest size
    "focus_vs_baseline_rss_growth_per_transition": 2.0,  # at the largest size
    "focus_idle_share": 0.10,  # at every row
}
#: Goals the other way round, at least this at every row: FOCUS / loop transitions per
#: second, against the loop a user would write and against the same loop with its GC off.
THROUGHPUT_GOALS = {
    "focus_vs_baseline_transitions_per_s": 1.0,
    "focus_vs_tuned_transitions_per_s": 1.0,
}


def size_label(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ratios the issue's goals name, and whether they are met."""
    vs_baseline = {
        r["key"]: _ratio(r["focus"]["cpu_ms_per_transition"], r["baseline"]["cpu_ms_per_transition"]) for r in rows
    }
    vs_baseline_np = {
        r["key"]: _ratio(
            r["focus"]["cpu_ms_per_transition_without_prepare"], r["baseline"]["cpu_ms_per_transition_without_prepare"]
        )
        for r in rows
    }
    vs_baseline_ng = {
        r["key"]: _ratio(
            r["focus"]["cpu_ms_per_transition_without_gc"], r["baseline"]["cpu_ms_per_transition_without_gc"]
        )
        for r in rows
    }
    throughput = {r["key"]: _ratio(r["focus"]["transitions_per_s"], r["baseline"]["transitions_per_s"]) for r in rows}
    smallest = min(r["transitions_budget"] for r in rows)
    base = {r["series"]: r for r in rows if r["transitions_budget"] == smallest}
    if "few" in base:
        base.setdefault("many", base["few"])  # both series start from one row where few == many
    growth = {}
    for r in rows:
        b = base.get(r["series"])
        if b is not None and r is not b:
            growth[r["key"]] = _ratio(r["focus"]["cpu_ms_per_transition"], b["focus"]["cpu_ms_per_transition"])
    largest = max(r["transitions_budget"] for r in rows)
    quarters = {r["key"]: r["focus"].get("plan_cpu_per_wave_last_vs_first_quarter") for r in rows}
    at_largest = {k: v for k, v in quarters.items() if v is not None and k.startswith(size_label(largest) + "_")}

    def worst(values: dict[str, float | None]) -> float | None:
        vals = [v for v in values.values() if v is not None]
        return max(vals) if vals else None

    ratios = {
        "focus_vs_baseline_cpu_per_transition": vs_baseline,
        "focus_vs_baseline_cpu_per_transition_without_prepare": vs_baseline_np,
        "focus_vs_baseline_cpu_per_transition_without_gc": vs_baseline_ng,
        "focus_vs_baseline_transitions_per_s": throughput,
        "focus_cpu_per_transition_vs_smallest": growth,
        "smallest_size": size_label(smallest),
        "plan_cpu_per_wave_last_vs_first_quarter": quarters,
        "plan_cpu_per_wave_last_vs_first_quarter_at_largest": at_largest,
        "largest_size": size_label(largest),
    }
    checked = {
        "focus_vs_baseline_cpu_per_transition": worst(vs_baseline),
        "focus_cpu_per_transition_vs_smallest": worst(growth),
        "plan_cpu_per_wave_last_vs_first_quarter": worst(at_largest),
    }
    memory_idle = summarise_memory_and_idle(rows)
    ratios.update(memory_idle)
    checked["focus_vs_baseline_rss_growth_per_transition"] = worst(
        memory_idle["focus_vs_baseline_rss_growth_per_transition_at_largest"]
    )
    checked["focus_idle_share"] = worst(memory_idle["focus_idle_share"])
    goals = {k: {"goal": GOALS[k], "worst": v, "met": v is not None and v <= GOALS[k]} for k, v in checked.items()}
    return with_tuned_arm({"ratios": ratios, "goals": goals}, rows)


def with_tuned_arm(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary`` with FOCUS / GC-tuned loop ratios per row (throughput, CPU per
    transition) and the throughput goals (:data:`THROUGHPUT_GOALS`: the worst row is
    the lowest ratio, met at or above the bound)."""
    ratios = dict(summary["ratios"])
    ratios["focus_vs_tuned_transitions_per_s"] = {
        r["key"]: _ratio(r["focus"]["transitions_per_s"], r["tuned"]["transitions_per_s"]) for r in rows if "tuned" in r
    }
    ratios["focus_vs_tuned_cpu_per_transition"] = {
        r["key"]: _ratio(r["focus"]["cpu_ms_per_transition"], r["tuned"]["cpu_ms_per_transition"])
        for r in rows
        if "tuned" in r
    }
    goals = dict(summary["goals"])
    for k, bound in THROUGHPUT_GOALS.items():
        vals = [v for v in ratios[k].values() if v is not None]
        worst = min(vals) if vals else None
        goals[k] = {"goal": bound, "worst": worst, "met": worst is not None and worst >= bound, "at_least": True}
    return {**summary, "ratios": ratios, "goals": goals}


def summarise_memory_and_idle(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Memory per transition, FOCUS / baseline (RSS growth over the RSS before
    collecting, per transition; and peak RSS), at every row and at the largest size;
    the share of the collection with no model call in flight (:class:`CallMeter`), and
    the server's idle and underfilled shares (:func:`server_occupancy`), per arm."""
    largest = size_label(max(r["transitions_budget"] for r in rows)) + "_"
    growth = {
        r["key"]: _ratio(r["focus"]["rss_growth_kib_per_transition"], r["baseline"]["rss_growth_kib_per_transition"])
        for r in rows
    }
    return {
        "focus_vs_baseline_rss_growth_per_transition": growth,
        "focus_vs_baseline_rss_growth_per_transition_at_largest": {
            k: v for k, v in growth.items() if k.startswith(largest)
        },
        "focus_vs_baseline_peak_rss": {
            r["key"]: _ratio(r["focus"]["peak_rss_mib"], r["baseline"]["peak_rss_mib"]) for r in rows
        },
        "focus_idle_share": {r["key"]: r["focus"].get("idle_share") for r in rows},
        "baseline_idle_share": {r["key"]: r["baseline"].get("idle_share") for r in rows},
        "focus_server_idle_share": {r["key"]: r["focus"].get("server_idle_share") for r in rows},
        "baseline_server_idle_share": {r["key"]: r["baseline"].get("server_idle_share") for r in rows},
        "focus_server_underfilled_share": {r["key"]: r["focus"].get("server_underfilled_share") for r in rows},
        "baseline_server_underfilled_share": {r["key"]: r["baseline"].get("server_underfilled_share") for r in rows},
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| size | tasks | FOCUS t/s | baseline t/s | FOCUS CPU ms/t (rollout + search + prepare) "
        "| baseline CPU ms/t (rollout + prepare) | CPU ratio | plan ms/wave first -> last quarter "
        "| GC ms/t FOCUS / baseline | peak RSS MiB FOCUS / baseline |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        f, b = r["focus"], r["baseline"]
        q = (
            f"{f['plan_cpu_ms_per_wave_first_quarter']:.0f} -> {f['plan_cpu_ms_per_wave_last_quarter']:.0f}"
            if f.get("continuation_waves")
            else ""
        )
        lines.append(
            f"| {size_label(r['transitions_budget'])} | {r['tasks']} | {f['transitions_per_s']:,.0f} "
            f"| {b['transitions_per_s']:,.0f} | {f['cpu_ms_per_transition']:.2f} "
            f"({f['rollout_cpu_ms_per_transition']:.2f} + {f['search_cpu_ms_per_transition']:.2f} "
            f"+ {f['prepare_cpu_ms_per_transition']:.2f}) | {b['cpu_ms_per_transition']:.2f} "
            f"({b['rollout_cpu_ms_per_transition']:.2f} + {b['prepare_cpu_ms_per_transition']:.2f}) "
            f"| {f['cpu_ms_per_transition'] / b['cpu_ms_per_transition']:.2f} | {q} "
            f"| {f['gc_cpu_ms_per_transition']:.2f} / {b['gc_cpu_ms_per_transition']:.2f} "
            f"| {f['peak_rss_mib']:.0f} / {b['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def memory_idle_table(rows: list[dict[str, Any]]) -> str:
    """Memory per transition, the share with no call in flight and the server's idle and
    underfilled shares, per row."""

    def share(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    lines = [
        "| size | tasks | RSS growth KiB/t FOCUS / baseline | ratio | peak RSS MiB FOCUS / baseline "
        "| idle share FOCUS / baseline | server idle share FOCUS / baseline | underfilled share FOCUS / baseline |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        f, b = r["focus"], r["baseline"]
        g = _ratio(f["rss_growth_kib_per_transition"], b["rss_growth_kib_per_transition"])
        lines.append(
            f"| {size_label(r['transitions_budget'])} | {r['tasks']} "
            f"| {f['rss_growth_kib_per_transition']:.2f} / {b['rss_growth_kib_per_transition']:.2f} "
            f"| {'n/a' if g is None else f'{g:.2f}'} | {f['peak_rss_mib']:.0f} / {b['peak_rss_mib']:.0f} "
            f"| {share(f.get('idle_share'))} / {share(b.get('idle_share'))} "
            f"| {share(f.get('server_idle_share'))} / {share(b.get('server_idle_share'))} "
            f"| {share(f.get('server_underfilled_share'))} / {share(b.get('server_underfilled_share'))} |"
        )
    return "\n".join(lines)


def arms_table(rows: list[dict[str, Any]]) -> str:
    """FOCUS against both loops per row: transitions per second and CPU per transition."""
    head = (
        "| size | tasks | t/s FOCUS / naive / tuned | t/s ratio FOCUS / naive, / tuned "
        "| CPU ms/t FOCUS / naive / tuned | CPU ratio FOCUS / naive, / tuned |"
    )
    lines = [head, "|" + "---|" * 6]
    for r in rows:
        f, b, u = r["focus"], r["baseline"], r["tuned"]
        tps, cpu = "transitions_per_s", "cpu_ms_per_transition"
        lines.append(
            f"| {size_label(r['transitions_budget'])} | {r['tasks']} "
            f"| {f[tps]:,.0f} / {b[tps]:,.0f} / {u[tps]:,.0f} | {f[tps] / b[tps]:.2f}, {f[tps] / u[tps]:.2f} "
            f"| {f[cpu]:.3f} / {b[cpu]:.3f} / {u[cpu]:.3f} | {f[cpu] / b[cpu]:.2f}, {f[cpu] / u[cpu]:.2f} |"
        )
    return "\n".join(lines)
