"""README renderers of the speed benchmarks: engine throughput, orchestration overhead,
search planning cost, scale against independent rollouts, HTTP client stacks, the fleet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.render_format import (
    code,
    each,
    ms,
    num,
    s_,
    span,
    table,
    verdict,
    x_,
)

ENGINE_MODES = (("pipeline_mode", "pipeline mode (waves in flight)"), ("wave_mode", "wave mode"),
                ("streaming_mode", "streaming"))  # fmt: skip


def engine(f: dict[str, Any]) -> str:
    modes = [(k, label) for k, label in ENGINE_MODES if k in f]
    goals = f.get("goals", {})

    def goal(key: str) -> str:
        if key not in goals:
            return ""
        op = "<=" if key == "engine_cpu_ms_per_transition" else ">="
        return f"{op} {num(goals[key]['goal'])}"

    def row(label: str, fn: Callable[[dict[str, Any]], str], key: str = "") -> list[str]:
        return [label, goal(key), *(fn(f[k]) for k, _ in modes)]

    rows = [
        row(
            "`slot_utilisation`, median run (each run)",
            lambda m: f"**{num(m['slot_utilisation'])}** ({each(m['slot_utilisation_repeats'])})",
            "slot_utilisation",
        ),
        row("`slot_utilisation_continuation`", lambda m: num(m["slot_utilisation_continuation"])),
        row(
            f"transitions/s (ideal {num(f['ideal_transitions_per_s'])})",
            lambda m: f"{num(m['transitions_per_s'])} ({num(100 * m['throughput_vs_ideal'])}%)",
        ),
        row(
            "`engine_cpu_ms_per_transition`",
            lambda m: f"**{num(m['engine_cpu_ms_per_transition'])}**",
            "engine_cpu_ms_per_transition",
        ),
        row("`prefix_cache_hit_ratio`", lambda m: f"**{num(m['prefix_cache_hit_ratio'])}**", "prefix_cache_hit_ratio"),
        row("cache hit ratio over all calls", lambda m: num(m["all_calls_cache_hit_ratio"])),
        row("transitions / rollouts / waves", lambda m: f"{m['transitions']:,} / {m['rollouts']:,} / {m['waves']}"),
        row("server CPU per request (its own process)", lambda m: ms(m["server_cpu_ms_per_request"] / 1000)),
    ]
    w = f.get("wave_mode", {})
    if "slot_utilisation_within_waves" in w:
        rows.append(
            [
                "wave mode: utilisation within waves; time between waves; CPU ms/transition in rollouts / between waves",
                "",
                "",
                f"{num(w['slot_utilisation_within_waves'])}; {s_(w['between_waves_s'])} of {s_(w['search_wall_s'])}; "
                f"{num(w['rollout_cpu_ms_per_transition'])} / {num(w['search_overhead_cpu_ms_per_transition'])}",
                *([""] * (len(modes) - 2)),
            ]
        )
    out = [
        f"Headline mode: `{f['headline_mode']}`; {len(f[modes[0][0]]['slot_utilisation_repeats'])} run(s) per mode, "
        f"interleaved{', each its own collection seed (0, 1, ...)' if 'collection_seed' in f else ''}; "
        f"{f['slots']} slots, {s_(f['call_latency_s'])} per call.",
        table(["figure", "goal", *(label for _, label in modes)], rows),
    ]
    dask = []
    for suffix, label in (("", "env steps with CPU work"), ("_toy_env", "plain toy env")):
        if f"scaling_1_to_2_workers{suffix}" not in f:
            continue
        one, two = f[f"dask_1_workers{suffix}"], f[f"dask_2_workers{suffix}"]
        key = f"scaling_1_to_2_workers{suffix}"
        dask.append(
            [
                f"{label} ({num(f[f'scale_env_cpu_ms{suffix}'])} ms CPU per step)",
                f"{num(one['transitions_per_s'])} / {num(two['transitions_per_s'])}",
                f"**{x_(f[key])}**",
                f">= {num(goals[key]['goal'])}: {verdict(f[key], goals[key]['goal'], '>=')}" if key in goals else "",
            ]
        )
    if dask:
        out.append(
            table(
                ["Dask scaling, `DaskExecution` 1 -> 2 workers", "transitions/s, 1 / 2 workers", "scaling", "goal"],
                dask,
            )  # fmt: skip
        )
    met = [f"`{k}` {'met' if g['met'] else '**missed**'}" for k, g in goals.items()]
    if met:
        out.append("Goals (the headline mode): " + ", ".join(met) + ".")
    return "\n\n".join(out)


def orchestration(f: dict[str, Any]) -> str:
    keys = [k.removeprefix("transitions_") for k in f if k.startswith("transitions_")]
    keys.sort(key=lambda k: (k.endswith("_inprocess"), f[f"transitions_{k}"]))  # service first, by size
    rows = []
    for key in keys:
        policy, label = (
            ("inprocess", key.removesuffix("_inprocess")) if key.endswith("_inprocess") else ("service", key)
        )
        ratio = f[f"overhead_ratio_{key}"]
        goal = f"<= 1.05: {verdict(ratio, 1.05, '<=')}" if key == "10k" else ""
        rows.append(
            [
                policy,
                label,
                f"{f[f'transitions_{key}']:,}",
                f"{s_(f[f'direct_collect_s_{key}'])} + {s_(f[f'direct_write_s_{key}'])}",
                s_(f[f"flow_s_{key}"]),
                s_(f[f"overhead_s_{key}"]),
                f"**{num(ratio)}** ({span(f[f'overhead_ratios_all_repeats_{key}'])})",
                num(f[f"overhead_ratio_vs_collect_only_{key}"]),
                f[f"flow_steps_{key}"],
                goal,
            ]
        )
    head = ["policy", "size", "transitions", "direct (collect + write)", "flow", "overhead", "ratio, median repeat "
            "(all repeats)", "ratio vs collecting alone", "flow steps", "goal"]  # fmt: skip
    return (
        f"{f['repeats']} repeat(s) per size; service {s_(f['service_latency_s'])} per call, in-process policy "
        f"{num(f['inprocess_latency_ms'])} ms per call.\n\n" + table(head, rows)
    )


def search_planning_scan(f: list[dict[str, Any]]) -> str:
    rows, notes = [], []
    for scan in f:
        d = scan["depth_of_continued_checkpoints"]
        notes.append(
            f"{scan['tasks']:,} tasks: {scan['transitions']:,} transitions ({scan['evidence_transitions']:,} in the "
            f"evidence phase), {scan['waves']} waves of {scan['wave_size']}, {scan['nodes']:,} nodes, "
            f"{s_(scan['wall_s'])}; mean depth of continued checkpoints {num(d['first_mean'])} -> "
            f"{num(d['last_mean'])}; calibration refits on waves {each(scan['calibrations_fitted_on_waves'])}."
        )
        for step in ("plan", "graft", "score"):
            q = scan[step]
            goal = ""
            if step == "plan":
                goal = f"<= 1.5: mean {verdict(q['ratio_mean'], 1.5, '<=')}, median {verdict(q['ratio_median'], 1.5, '<=')}"
            rows.append(
                [
                    scan["tasks"],
                    step,
                    f"{num(q['first_mean'])} / {num(q['first_median'])}",
                    f"{num(q['last_mean'])} / {num(q['last_median'])}",
                    f"**{num(q['ratio_mean'])}**, {num(q['ratio_median'])}, {num(q['ratio_per_kt'])}",
                    goal,
                ]
            )
    head = ["tasks", "step", "first quarter, ms per wave (mean / median)", "last quarter, ms per wave (mean / median)",
            "last / first: mean, median, per 1k transitions", "goal (plan, last / first)"]  # fmt: skip
    return "\n".join(f"- {n}" for n in notes) + "\n\n" + table(head, rows)


def search_planning(f: list[dict[str, Any]]) -> str:
    rows = [
        [
            r["tasks"],
            f"{r['nodes']:,}",
            f"{r['transitions']:,}",
            num(r["plan_ms"]),
            num(r["graft_ms"]),
            num(r["score_ms"]),
            num(r["rollouts_ms"]),
            num(r["plan_cold_ms"]),
            num(r["graft_cold_ms"]),
            x_(r["plan_cold_ms"] / r["plan_ms"] if r["plan_ms"] else None),
        ]
        for r in f
    ]
    head = ["tasks", "nodes", "transitions", "plan", "graft", "score", "rollouts", "plan, cold (baseline)",
            "graft after a full copy (baseline)", "cold / incremental plan"]  # fmt: skip
    return "Medians over the measured waves, ms per wave.\n\n" + table(head, rows)


def scale(f: dict[str, Any]) -> str:
    rows = []
    for r in f["rows"]:
        a, b = r["focus"], r["baseline"]
        quarters = (
            f"{num(a['plan_cpu_ms_per_wave_first_quarter'])} -> {num(a['plan_cpu_ms_per_wave_last_quarter'])}"
            if a.get("continuation_waves")
            else ""
        )
        if quarters and "jobs_per_wave_first_quarter" in a:  # (records before 2026-12-06 lack it)
            quarters += f" ({num(a['jobs_per_wave_first_quarter'])} -> {num(a['jobs_per_wave_last_quarter'])} jobs)"
        rows.append(
            [
                r["key"].split("_")[0],
                r["tasks"],
                f"{num(a['transitions_per_s'])} / {num(b['transitions_per_s'])}",
                f"{num(a['cpu_ms_per_transition'])} ({num(a['rollout_cpu_ms_per_transition'])} + "
                f"{num(a['search_cpu_ms_per_transition'])} + {num(a['prepare_cpu_ms_per_transition'])})",
                f"{num(b['cpu_ms_per_transition'])} ({num(b['rollout_cpu_ms_per_transition'])} + "
                f"{num(b['prepare_cpu_ms_per_transition'])})",
                f"**{num(a['cpu_ms_per_transition'] / b['cpu_ms_per_transition'])}**",
                quarters,
                f"{num(a['gc_cpu_ms_per_transition'])} / {num(b['gc_cpu_ms_per_transition'])}",
                f"{num(a['peak_rss_mib'])} / {num(b['peak_rss_mib'])}",
                f"{num(a['rss_growth_kib_per_transition'])} / {num(b['rss_growth_kib_per_transition'])}",
            ]
        )
    head = ["size", "tasks", "transitions/s, FOCUS / baseline", "FOCUS CPU ms/t (rollout + search + prepare)",
            "baseline CPU ms/t (rollout + prepare)", "CPU ratio", "plan CPU ms per wave, first -> last quarter",
            "GC ms/t, FOCUS / baseline", "peak RSS MiB, FOCUS / baseline",
            "RSS growth KiB/t, FOCUS / baseline"]  # fmt: skip
    ratios, goals = f["ratios"], f["goals"]

    order = [r["key"] for r in f["rows"]]

    def listed(d: dict[str, Any]) -> str:
        keys = sorted(d, key=lambda k: order.index(k) if k in order else len(order))
        return ", ".join(f"{k} {num(d[k])}" for k in keys) or "n/a"

    texts = {
        "focus_vs_baseline_cpu_per_transition": (
            "FOCUS / baseline CPU per transition, every row",
            ratios["focus_vs_baseline_cpu_per_transition"],
        ),
        "focus_cpu_per_transition_vs_smallest": (
            f"FOCUS CPU per transition / its value at {ratios['smallest_size']}, per task series",
            ratios["focus_cpu_per_transition_vs_smallest"],
        ),
        "plan_cpu_per_wave_last_vs_first_quarter": (
            f"plan CPU per wave, last quarter / first quarter, at {ratios['largest_size']}",
            ratios["plan_cpu_per_wave_last_vs_first_quarter_at_largest"],
        ),
        "focus_vs_baseline_rss_growth_per_transition": (
            f"FOCUS / baseline RSS growth per transition, at {ratios['largest_size']}",
            ratios.get("focus_vs_baseline_rss_growth_per_transition_at_largest", {}),
        ),
        "focus_idle_share": (
            "FOCUS's share of the collection with no model call in flight, every row",
            ratios.get("focus_idle_share", {}),
        ),
        "focus_vs_baseline_transitions_per_s": (
            "FOCUS / baseline (naive loop) transitions per second, every row",
            ratios["focus_vs_baseline_transitions_per_s"],
        ),
        "focus_vs_tuned_transitions_per_s": (
            "FOCUS / GC-tuned loop transitions per second, every row",
            ratios.get("focus_vs_tuned_transitions_per_s", {}),
        ),
    }
    goal_rows = [
        [texts[k][0], f"{'>=' if g.get('at_least') else '<='} {num(g['goal'])}", f"**{num(g['worst'])}**",
         "met" if g["met"] else "**missed**", listed(texts[k][1])]
        for k, g in goals.items()
        if k in texts
    ]  # fmt: skip
    cfg = f["config"]
    return "\n\n".join(
        [
            f"Server: {cfg['slots']} slots at {num(cfg['latency_ms'])} ms per call, {cfg['completion_tokens']} tokens "
            f"per call; {cfg['concurrency']} rollouts in flight; critic {code(cfg['critic'])}.",
            table(head, rows),
            *_scale_arms(f),
            table(["goal", "bound", "worst", "met", "each"], goal_rows),
            "Without GC CPU in either arm, FOCUS / baseline CPU per transition: "
            + listed(ratios["focus_vs_baseline_cpu_per_transition_without_gc"])
            + ". Slot utilisation of the server, highest of any arm: "
            + num(max(r[a]["slot_utilisation"] for r in f["rows"] for a in ("focus", "baseline")))
            + ".",
            *_scale_memory_idle(f),
            *_scale_repeats(f),
        ]
    )


def _scale_memory_idle(f: dict[str, Any]) -> list[str]:
    """Memory per transition and idle shares per row (records before these figures
    have none and no such table)."""
    if not all("idle_share" in r["focus"] for r in f["rows"]):
        return []

    def pair(r: dict[str, Any], k: str) -> str:
        return f"{num(r['focus'][k])} / {num(r['baseline'][k])}"

    rows = [
        [
            r["key"].split("_")[0],
            r["tasks"],
            pair(r, "rss_growth_kib_per_transition"),
            f"**{num(r['focus']['rss_growth_kib_per_transition'] / r['baseline']['rss_growth_kib_per_transition'])}**",
            pair(r, "idle_share"),
            pair(r, "server_idle_share"),
            pair(r, "server_underfilled_share"),
        ]
        for r in f["rows"]
    ]
    head = ["size", "tasks", "RSS growth KiB/t, FOCUS / baseline", "memory ratio", "idle share, FOCUS / baseline",
            "server idle share, FOCUS / baseline", "server underfilled share, FOCUS / baseline"]  # fmt: skip
    return [
        "Memory and idle time. *Idle share*: the share of the collection (first model call to last answer) "
        "with no model call in flight; *server idle* / *underfilled*: no request in the server / fewer than "
        "half its slots in service, from its request log (these also count answers waiting for a busy client).",
        table(head, rows),
    ]


def _scale_arms(f: dict[str, Any]) -> list[str]:
    """FOCUS against the naive and the GC-tuned loop per row (records before the tuned
    arm have none and no such table)."""
    if not all("tuned" in r for r in f["rows"]):
        return []
    rows = []
    for r in f["rows"]:
        a, b, u = r["focus"], r["baseline"], r["tuned"]
        tps, cpu = "transitions_per_s", "cpu_ms_per_transition"
        rows.append(
            [
                r["key"].split("_")[0],
                r["tasks"],
                f"{num(a[tps])} / {num(b[tps])} / {num(u[tps])}",
                f"**{num(a[tps] / b[tps])}** / **{num(a[tps] / u[tps])}**",
                f"{num(a[cpu])} / {num(b[cpu])} / {num(u[cpu])}",
                f"{num(u['rollout_cpu_ms_per_transition'])} + {num(u['prepare_cpu_ms_per_transition'])}",
                f"{num(a[cpu] / b[cpu])} / {num(a[cpu] / u[cpu])}",
                " -> ".join(
                    num(x) for x in (r.get("load_average_before", [None])[0], r.get("load_average_after", [None])[0])
                ),
            ]
        )
    head = ["size", "tasks", "transitions/s, FOCUS / naive / GC-tuned", "throughput ratio, FOCUS / naive, / tuned",
            "CPU ms/t, FOCUS / naive / tuned", "tuned CPU ms/t (rollout + prepare)", "CPU ratio, FOCUS / naive, / tuned",
            "load average (1 min), before -> after the row"]  # fmt: skip
    return ["FOCUS against the naive loop and the GC-tuned loop (`gc.disable()` from the first env reset to the built "
            "batch), each arm's median run:", table(head, rows)]  # fmt: skip


def _scale_repeats(f: dict[str, Any]) -> list[str]:
    """Each run's CPU per transition, where rows ran more than once (records before
    ``--repeats`` have one run per row and no such line)."""
    each = {
        r["key"]: (r["focus_cpu_ms_per_transition_each_run"], r["baseline_cpu_ms_per_transition_each_run"])
        for r in f["rows"]
        if len(r.get("focus_cpu_ms_per_transition_each_run", ())) > 1
    }
    if not each:
        return []
    runs = "; ".join(
        f"{k} FOCUS {', '.join(num(v) for v in a)}, baseline {', '.join(num(v) for v in b)}"
        for k, (a, b) in each.items()
    )
    n = f["config"]["repeats"]
    return [
        f"Rows up to {f['config']['repeat_max_size']:,} transitions ran {n} times, the repeats going round the rows; "
        f"each arm reports its median run. CPU ms per transition of each run: {runs}."
    ]


HTTP_STACKS = {
    "aiohttp": "bare `aiohttp.ClientSession`",
    "aiohttp_orjson": "bare `aiohttp.ClientSession`, `orjson` for JSON",
    "httpx": "`httpx.AsyncClient`, httpx's own transport (httpcore + h11)",
    "httpx_aiohttp_client": "`httpx.AsyncClient` over `httpx_aiohttp.AiohttpTransport`",
    "httpx_aiohttp_transport": "`httpx.Request` straight to `AiohttpTransport`",
    "focus_client": "**`OpenAICompatPolicy.sample` (the kept stack)**",
}


def http_client(f: dict[str, Any]) -> str:
    columns = [("simserver", n, f"simserver, {n} in flight") for n in sorted(f["simserver"], key=int)]
    columns += [("tinylm", n, f"tiny model, {n} in flight") for n in sorted(f.get("tinylm", {}), key=int)]
    cpu_rows, rate_rows = [], []
    for stack in f["stacks"]:
        cpu, rate = [HTTP_STACKS.get(stack, stack)], [HTTP_STACKS.get(stack, stack)]
        for server, n, _ in columns:
            m = f[server][n][stack]
            c, r = m["cpu_ms_per_request"], m["requests_per_s"]
            cpu.append(f"{num(c['median'])} ms ({span([c['min'], c['max']])}), {x_(m['cpu_ratio_vs_aiohttp'])}")
            rate.append(f"{num(r['median'])} ({span([r['min'], r['max']])})")
        cpu_rows.append(cpu)
        rate_rows.append(rate)
    heads = ["stack", *(label for _, _, label in columns)]
    return "\n\n".join(
        [
            "CPU per call, median of repeats (min-max), and the median per-repeat ratio to bare aiohttp:",
            table(heads, cpu_rows),
            "Calls per second, median of repeats (min-max):",
            table(heads, rate_rows),
        ]
    )


def fleet(f: dict[str, Any]) -> str:
    def sweep_table(runs: dict[str, Any]) -> str:
        rows = []
        for key, r in runs.items():
            n, kind = key.split("/")
            rows.append(
                [
                    n,
                    FLEET_ROUTERS.get(kind, kind),
                    num(r["throughput"]),
                    x_(r.get("throughput_vs_n_x_one")),
                    x_(r.get("throughput_vs_unsplit")),
                    num(r["hit_rate"]),
                    x_(r.get("hit_rate_vs_one")),
                    num(r["prefill_tokens"]),
                    x_(r["load_spread"]),
                    num(r["failed_rollouts"]),
                ]
            )
        head = [
            "N",
            "routing",
            "transitions/s",
            "vs N x one",
            "vs unsplit",
            "hit rate",
            "vs one",
            "prefill tokens",
            "busiest/mean",
            "failed",
        ]
        return table(head, rows)

    runs, k = f["runs"], f["kill"]
    four = runs.get("4/focus", {})
    goals = (
        f"Goals at N = 4 with FOCUS's routing: hit rate >= 0.95 of one server's: "
        f"{verdict(four.get('hit_rate_vs_one'), 0.95, '>=')} ({x_(four.get('hit_rate_vs_one'))}); "
        f"throughput >= 0.9 x 4 x one replica: {verdict(four.get('throughput_vs_n_x_one'), 0.9, '>=')} "
        f"({x_(four.get('throughput_vs_n_x_one'))}); a killed replica costs no failed rollout and the batch "
        f"equals the clean one: {'met' if k['failed_rollouts'] == 0 and k['batch_equal'] else '**missed**'}."
    )
    knobs = ", ".join(f"{FLEET_ROUTERS.get(r, r)} {kv or '(none)'}" for r, kv in f["knobs"].items())
    parts = [
        goals,
        f"Knobs (best throughput at N = 4 of each router's grid): {knobs}.",
        f"Waves of {f.get('wave', 3)}x the rollouts in flight:",
        sweep_table(runs),
        "Waves as large as the rollouts in flight:",
        sweep_table(f["waves_of_one"]),
        (
            f"A replica killed at N = 4 after {k['killed_after_calls']} of its calls: {k['failed_rollouts']} failed "
            f"rollouts, {k['failovers']} calls failed over, batch equal bit for bit: "
            f"{'yes' if k['batch_equal'] else '**no**'}; {num(k['throughput'])} transitions/s against "
            f"{num(k['clean_throughput'])} uninterrupted."
        ),
    ]
    if "tinylm" in f:
        rows = [
            [key.split("/")[0], FLEET_ROUTERS.get(key.split("/")[1], key), num(r["hit_rate"]), x_(r["load_spread"])]
            for key, r in f["tinylm"].items()
        ]
        parts += ["Embedded tiny-model servers (hit rates):", table(["N", "routing", "hit rate", "busiest/mean"], rows)]
    return "\n\n".join(parts)


FLEET_ROUTERS = {
    "focus": "**FOCUS (tree)**",
    "round_robin": "round-robin",
    "cache_aware": "cache-aware (SGLang-style)",
    "unsplit": "one server, N x capacity",
}
