"""Renders benchmarks/README.md's figures from the records in ``benchmarks/results/``.

The README is prose (what each benchmark measures, its goal, how to read it, its
command) plus generated blocks::

    <!-- generated: engine -->
    ...tables rendered from results/engine.json...
    <!-- end generated: engine -->

:func:`render` replaces the inside of every block with what the record gives and leaves
the prose alone, so no measured figure is typed by hand: rendering the committed records
must reproduce the committed README byte for byte (a test checks it). A benchmark with
no record yet renders as not run. Each block starts with the run's line (date, commit,
wall time, command, machine, load average before, at most during and after).

A renderer reads keys of its benchmark's JSON; if one is missing (the benchmark's
figures changed) the block says so instead of failing the whole README, and
:func:`render` returns a warning naming it.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results import BY_NAME, REGISTRY, RESULTS, command_args, read

BLOCK = re.compile(r"<!-- generated: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- end generated: (?P=name) -->", re.S)
SUMMARY = "summary"

# -- formatting --------------------------------------------------------------------------


def num(x: Any, sig: int = 3) -> str:
    """``x`` to ``sig`` significant digits (all digits of the integer part), with
    thousands separators; ``n/a`` for nothing."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if abs(x) >= 10 and x == round(x):  # a count or a rate the benchmark rounded
        return f"{x:,.0f}"
    if abs(x) < 1e-3:
        return f"{x:.{sig - 1}e}"
    digits = max(0, sig - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{digits}f}"


def unit(x: Any, name: str, sig: int = 3) -> str:
    """``x`` with its unit (``n/a`` alone for nothing)."""
    text = num(x, sig)
    return text if text == "n/a" else f"{text}{name}"


def x_(r: Any, sig: int = 3) -> str:
    """A ratio: ``1.23x``."""
    return unit(r, "x", sig)


def ms(seconds: Any, sig: int = 3) -> str:
    return unit(None if seconds is None else 1000 * seconds, " ms", sig)


def s_(seconds: Any, sig: int = 3) -> str:
    return unit(seconds, " s", sig)


def duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def span(xs: Iterable[Any], fmt: Callable[[Any], str] = num) -> str:
    """``min-max`` of ``xs`` (one value: that value)."""
    vals = [x for x in xs if x is not None]
    if not vals:
        return "n/a"
    lo, hi = fmt(min(vals)), fmt(max(vals))
    return lo if lo == hi else f"{lo}-{hi}"


def each(xs: Iterable[Any], fmt: Callable[[Any], str] = num) -> str:
    return ", ".join(fmt(x) for x in xs)


def verdict(value: Any, goal: float, op: str) -> str:
    """``met`` / ``**missed**`` for ``value op goal`` (``<=`` or ``>=``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    ok = value <= goal if op == "<=" else value >= goal
    return "met" if ok else "**missed**"


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


# -- the run's line --------------------------------------------------------------------------


def machine_text(m: dict[str, Any]) -> str:
    flags = "/".join(f.upper() for f in m.get("cpu_flags", []) if f in ("avx2", "avx512f"))
    mem = f", {num(m['memory_gib'])} GiB" if m.get("memory_gib") else ""
    return (
        f"{m.get('cores')} cores ({m.get('cpu_model')}{', ' + flags if flags else ''}){mem}, Python {m.get('python')}"
    )


def run_line(rec: dict[str, Any]) -> str:
    when = rec["started_utc"].replace("T", " ")[:16] + " UTC"
    before = (rec.get("load_average_before") or [None])[0]
    after = (rec.get("load_average_after") or [None])[0]
    load = f"load average {num(before)} before, {num(rec.get('load_average_max_during'))} at most during, {num(after)} after"
    line = (
        f"Run of {when} at {code(str(rec.get('git_commit')))}, {duration(rec['wall_s'])}: {code(rec['command'])}; "
        f"{machine_text(rec['machine'])}; {load}."
    )
    if rec.get("quick"):
        line += " **Smoke run (`--quick`): sizes too small for these figures to mean anything.**"
    return line


def not_run(name: str) -> str:
    b = BY_NAME[name]
    full = " ".join(["python -m", b.module, *command_args(b, RESULTS, False)])
    return f"_Not run on this machine yet: `python -m benchmarks --only {name}` (runs {code(full)})._"


# -- one renderer per benchmark -------------------------------------------------------------


def local_model(f: dict[str, Any]) -> str:
    t, p, c, r = f["throughput"], f["prefix_cache"], f["conformance"], f["robustness"]
    tl, base, st, ab = f["throughput_loaded"], f["throughput_loaded_thread_per_core"], f["streaming"], f["aborts"]
    rounds = t["rounds"]

    def conc(n: int, rows: dict[str, Any] = t) -> str:
        row = rows[f"concurrency_{n}"]
        return f"{s_(row['wall_s'])}, {num(row['tokens_per_s'])} tokens/s (rounds: {span(row['wall_s_rounds'], s_)})"

    def stream_row(kind: str) -> str:
        x = st[kind]
        return (
            f"{s_(x['wall_s'])} ({span(x['wall_s_rounds'], s_)}), {num(x['tokens_per_s'])} tokens/s; server CPU "
            f"{s_(x['loop_cpu_s'])} loop + {s_(x['engine_cpu_s'])} engine, {num(x['server_cpu_ms_per_token'])} ms/token"
        )

    def abort_row(key: str) -> str:
        x = ab[key]
        return (
            f"**{s_(x['seconds_median'])}** median, {s_(x['seconds_max'])} max ({x['tokens_after_median']:.0f} "
            f"tokens decoded meanwhile)"
        )

    failed = "; ".join(f"{k}: {v}" for k, v in c["failed"].items())
    loaded = f"with {f['burners']} CPU burners"
    rows = [
        ["32 requests x 32 tokens, one at a time", conc(1), ""],
        ["the same, 8 in flight", f"{conc(8)}, {x_(t['speedup_8'])}", ""],
        [
            "the same, 32 in flight (decoded together)",
            f"{conc(32)}, **{x_(t['speedup_32'])}**",
            f">= 6x: {verdict(t['speedup_32'], 6, '>=')}",
        ],
        [f"{loaded}: one at a time", conc(1, tl), ""],
        [f"{loaded}: 32 in flight", f"{conc(32, tl)}, **{x_(tl['speedup_32'])}**", f">= 4x: {verdict(tl['speedup_32'], 4, '>=')}"],
        [
            f"{loaded}, a server with {base['threads']} BLAS threads (one per core): 1 / 32 in flight, one round",
            f"{s_(base['concurrency_1']['wall_s'])} / {s_(base['concurrency_32']['wall_s'])}, {x_(base['speedup_32'])}",
            "",
        ],
        [
            f"ids and log-probs of the same requests at 1/8/32 in flight, {rounds} rounds, idle and loaded",
            f"{t['invariance_mismatches'] + tl['invariance_mismatches']} of "
            f"{t['invariance_compared'] + tl['invariance_compared']} differ from the first run",
            f"0: {verdict(t['invariance_mismatches'] + tl['invariance_mismatches'], 0, '<=')}",
        ],
        [f"{st['requests']} requests x {st['max_tokens']} tokens all in flight, non-streamed", stream_row("plain"), ""],
        [
            "the same, streamed",
            f"{stream_row('stream')}; streams/non-streamed: wall {x_(st['stream_wall_ratio'])}, "
            f"server CPU {x_(st['stream_cpu_ratio'])}; {st['id_mismatches']} answers differ",
            "",
        ],
        [f"a non-streamed request of {num(ab['max_tokens'])} tokens, client gone: server stops in", abort_row("one"), f"<= 0.2 s: {verdict(ab['one']['seconds_median'], 0.2, '<=')}"],
        [f"{ab['together']} such requests at once", abort_row("many"), f"<= 0.2 s: {verdict(ab['many']['seconds_median'], 0.2, '<=')}"],
        [
            f"{p['prompt_tokens']:,}-token prompt, 1 new token, cold",
            f"{ms(p['cold_ms'] / 1000)} (runs: {span(p['cold_ms_runs'])} ms)",
            "",
        ],
        [
            "the same prompt again (prefix-cache hit)",
            f"{ms(p['hit_ms'] / 1000)} (runs: {span(p['hit_ms_runs'])} ms), **{x_(p['speedup'])}**",
            f">= 5x: {verdict(p['speedup'], 5, '>=')}",
        ],
        [
            "request shapes through the `openai` SDK + vLLM/SGLang protocol models",
            f"{c['shapes'] - c['failures']}/{c['shapes']} ok" + (f" (failed: {failed})" if failed else ""),
            f"all: {verdict(c['failures'], 0, '<=')}",
        ],
        [
            "malformed requests answered 4xx in vLLM's error layout",
            f"{r['answered_4xx']}/{r['malformed']}, still serving: {num(r['still_serving'])}",
            f"all: {verdict(r['malformed'] - r['answered_4xx'] + (not r['still_serving']), 0, '<=')}",
        ],
    ]  # fmt: skip
    head = f"Server: {f['threads']} BLAS thread(s)" + (
        " (the default)." if f["threads_is_default"] else " (**not the default**)."
    )
    return head + "\n\n" + table(["measurement", f"result (median of {rounds} rounds where timed)", "goal"], rows)


def batch_write(f: dict[str, Any]) -> str:
    head = [
        "target",
        "store write, fastest / median",
        "pyarrow write, fastest / median",
        "write ratio, median of repeats (each repeat)",
        "CPU ratio",
        "same-settings ratio",
        "`overlap=True` ratio",
        "read as Arrow (vs pyarrow)",
        "read as typed rows",
        "size (yardstick)",
    ]
    rows = []
    for key in ("local", "s3"):
        if key not in f:
            continue
        m = f[key]
        rows.append(
            [
                "local folder" if key == "local" else "S3 (moto, loopback)",
                f"{ms(m['write_s'])} / {ms(m['write_s_median'])}",
                f"{ms(m['pyarrow_write_s'])} / {ms(m['pyarrow_write_s_median'])}",
                f"**{x_(m['write_ratio_vs_pyarrow'])}** ({span(m['write_ratios'], x_)})",
                x_(m["write_cpu_ratio_vs_pyarrow"]),
                x_(m["same_settings_ratio"]),
                x_(m["overlap_write_ratio_vs_pyarrow"]),
                f"{ms(m['read_tables_s'])} ({x_(m['read_tables_ratio_vs_pyarrow'])})",
                f"{ms(m['read_rows_s'])}, {num(m['read_rows_per_s'])} rows/s",
                f"{num(m['bytes'] / 1e6)} MB, {num(m['bytes_per_token'])} B/token ({num(m['pyarrow_bytes_per_token'])})",
            ]
        )
    loc = f["local"]
    goal = table(
        ["goal", "result"],
        [["local write within 1.2x of the yardstick (median ratio)", f"{x_(loc['write_ratio_vs_pyarrow'])}: "
          f"{verdict(loc['write_ratio_vs_pyarrow'], 1.2, '<=')}"]],
    )  # fmt: skip
    batch = (
        f"Batch: {f['tokens']:,} token ids, {loc['actor_rows']:,} actor and {loc['critic_rows']:,} critic rows, "
        f"{f['repeats']} repeats; built as columns (`BatchBuilder`) in {ms(f['build_s'])}."
    )
    return f"{batch}\n\n{table(head, rows)}\n\n{goal}"


def writer_race(f: dict[str, Any]) -> str:
    rows = []
    for key in ["local", *(["s3"] if "s3" in f else [])]:  # local always runs
        r = f[key]
        rows.append(
            [
                "local folder" if key == "local" else "S3 (moto)",
                f"{f['attempts']} x {f['writers']}",
                s_(r["wall_s"]),
                f"**{r['holders_max']}** ({verdict(r['holders_max'], 1, '<=')})",
                f"{r['won']} / {r['refused']}",
                r["manifests"],
                f"**{r['mismatched']}** ({verdict(r['mismatched'], 0, '<=')})",
                f"{r['leftovers']} ({verdict(r['leftovers'], 0, '<=')})",
            ]
        )
    head = [
        "store",
        "attempts x writers",
        "wall",
        "lease holders at once, max (goal 1)",
        "lease taken / refused",
        "manifests checked",
        "mismatched (goal 0)",
        "leftovers (goal 0)",
    ]
    out = table(head, rows)
    refusals = f["local"].get("refusals") or []
    if refusals:
        out += f"\n\nA refusal reads: {code(refusals[0])}"
    return out


#: (summary key, what it compares, statistic the goal is on, goal as (op, value), goal text)
EQ_SUMMARY: tuple[tuple[str, str, str, tuple[str, float] | None, str], ...] = (
    ("selective_vs_grpo_noisy", "selective vs GRPO, noisy critics", "median", ("<=", 0.5), "<= 0.5"),
    ("selective_vs_uniform_noisy", "selective vs uniform branching, noisy critics", "median", ("<=", 0.8), "<= 0.8"),
    ("selective_vs_uniform_constant", "selective vs uniform, constant critic", "median", ("<=", 1.0), "<= 1.0"),
    ("selective_vs_uniform_all_cells", "selective vs uniform, every cell", "worst", ("<=", 1.1), "no cell > 1.1"),
    ("target_selective_vs_uniform_all_cells", "critic-target MSE, selective vs uniform, every cell", "median",
     ("<=", 1.0), "no worse than uniform (median)"),
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
    ("neutral_selective_vs_uniform_depth_critics", "selective vs uniform, biased and early/late critics", "median",
     None, ""),
    ("neutral_selective_vs_grpo_depth_critics", "selective vs GRPO, biased and early/late critics", "median", None,
     ""),
    ("neutral_selective_vs_uniform_all_cells", "selective vs uniform, every cell", "worst", ("<=", 1.1),
     "no cell > 1.1"),
    ("selective_vs_uniform_noisy", "batch MSE: selective vs uniform, noisy critics", "median", ("<=", 0.8), "<= 0.8"),
    ("selective_vs_uniform_constant", "batch MSE: selective vs uniform, constant critic", "median", ("<=", 1.0),
     "<= 1.0"),
    ("selective_vs_grpo_noisy", "batch MSE: selective vs GRPO, noisy critics", "median", ("<=", 0.5), "<= 0.5"),
    ("selective_vs_uniform_depth_critics", "batch MSE: selective vs uniform, biased and early/late critics",
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


def load(f: dict[str, Any]) -> str:
    def kinds(d: dict[str, Any], fmt: Callable[[Any], str] = lambda v: f"{v:,}") -> str:
        return ", ".join(f"{k} {fmt(v)}" for k, v in sorted(d.items())) or "0"

    client = "the library's defaults" if f["client_is_default"] else f"**not the defaults**: {f['client_overrides']}"
    waves = f"{f['waves_in_flight']}" + (
        " (the default)" if f["waves_in_flight_is_default"] else " (**not the default**)"
    )
    out = [
        f"Server `{f['server']}`, {num(100 * f['fault_rate'])}% of generation requests faulted, "
        f"{f['concurrency']} rollouts in flight, waves in flight {waves}; HTTP client: {client} "
        f"(timeout {s_(f['client']['timeout_s'])}; a hang lasts {s_(f['hang_s'])})."
    ]
    for r in f["sizes"]:
        q, c, w = r["wall_ratio"], r["clean_wall_s"], r["faulty_wall_s"]
        m = r["median_pair"]
        clean, faulty = m["clean"], m["faulty"]
        goal_rows = [
            [
                f"wall time, faulty / fault-free, median of {r['repeats']} pair(s) (every pair)",
                "<= 1.3",
                f"**{x_(q['median'])}** ({each(q['runs'], x_)}): {verdict(q['median'], 1.3, '<=')}",
            ],
            ["batches identical, every pair", "yes", num(r["identical_batches_every_repeat"])],
            ["rows lost / duplicated (median pair)", "0 / 0", f"{m['rows_lost']} / {m['rows_duplicated']}"],
            ["failed rollouts, faulty runs", "0", each(r["failed_rollouts_faulty"], str)],
        ]
        comp = [
            ["transitions / rollouts / waves", *(f"{x['transitions']:,} / {x['rollouts']:,} / {x['waves']}" for x in (clean, faulty))],
            ["wall time, median (min-max)", f"{s_(c['median'])} ({span(c['runs'], s_)})", f"{s_(w['median'])} ({span(w['runs'], s_)})"],
            ["generation requests", *(f"{x['requests']:,}" for x in (clean, faulty))],
            ["faults injected", "0", f"{sum(r['faults_injected'].values()):,}: {kinds(r['faults_injected'])}"],
            ["retries, by cause", kinds(clean["client"]["retries"]), kinds(r["retries_by_cause"])],
            ["seconds lost to failed attempts, by cause", kinds(clean["client"]["lost_s"], s_), kinds(r["retry_lost_s_by_cause"], s_)],
            [
                "hedges sent (won); seconds the overtaken requests had waited",
                f"{max(r['clean_hedges_every_repeat'])} at most per run",
                f"{r['hedges']} ({r['hedge_wins']}); {s_(r['hedge_lost_s'])}",
            ],
            *server_token_rows(r, clean, faulty),
            ["CPU, collecting process", s_(clean["cpu_s"]), s_(faulty["cpu_s"])],
            ["peak RSS", *(f"{num(x['peak_rss'] / 2**20)} MiB" for x in (clean, faulty))],
            [
                "RSS growth per transition, second half",
                unit(m["bytes_per_transition_clean"] / 1e3, " KB"),
                unit(m["bytes_per_transition_faulty"] / 1e3, " KB"),
            ],
        ]  # fmt: skip
        out += [
            f"**{r['transitions_asked']:,} transitions asked.**",
            table(["figure", "goal", "result"], goal_rows),
            table(["median pair", "fault-free", "faulty"], comp),
        ]
    return "\n\n".join(out)


def server_token_rows(r: dict[str, Any], clean: dict[str, Any], faulty: dict[str, Any]) -> list[list[str]]:
    """What the model server decoded for the batch (servers with ``/metrics`` only)."""
    cs, fs = clean.get("server_tokens"), faulty.get("server_tokens")
    if not cs or not fs:
        return []
    every = [x["decoded_per_stored"] for x in r["server_tokens_faulty_every_repeat"]]
    damaged = sum(v for k, v in r["faults_injected"].items() if k in ("nan_logprobs", "short_logprobs"))
    return [
        [
            "tokens the server decoded / tokens stored (faulty: every pair)",
            f"{num(cs['decoded']):s} / {num(cs['stored'])} = **{x_(cs['decoded_per_stored'], 4)}**",
            f"{num(fs['decoded'])} / {num(fs['stored'])} = **{x_(fs['decoded_per_stored'], 4)}** ({each(every, x_)})",
        ],
        [
            "answers decoded in full, then refused by the client (NaN or short log-probs); requests the server aborted",
            f"0; {num(cs['aborted_requests'])}",
            f"{damaged}; {num(fs['aborted_requests'])}",
        ],
        [
            "tokens decoded for nothing (decoded - stored); the refused answers' share (their count x stored tokens per call)",
            f"{num(cs['decoded'] - cs['stored'])}",
            f"{num(fs['decoded'] - fs['stored'])}; {num(damaged * cs['stored'] / r['requests']['clean'])}",
        ],
    ]


def train_local(f: dict[str, Any]) -> str:
    settings = f["settings"]
    base = next((s for s in settings if not s["pack"] and s["torch_threads"] == 2), settings[0])
    rows = [
        [
            f"pack={s['pack']} threads={s['torch_threads']}" + (" (the defaults)" if s["pack"] and s["torch_threads"] == 1 else ""),
            s_(s["median_s"]),
            each(s["runs_s"], s_),
            x_(base["median_s"] / s["median_s"]),
        ]
        for s in settings
    ]  # fmt: skip
    fewer = 1 - f["packed_tokens"] / f["tokens"] if f["tokens"] else None
    return "\n\n".join(
        [
            f"Batch: {f['actor_rows']:,} actor rows, {f['sequences']:,} sequences ({f['tokens']:,} tokens); packed: "
            f"{f['packed_sequences']:,} sequences ({f['packed_tokens']:,} tokens, {num(100 * fewer) if fewer is not None else 'n/a'}% "
            f"fewer); {f['repeats']} repeats per setting.",
            table(
                ["setting", "median", "each run", f"speed-up vs pack=False threads={base['torch_threads']}"], rows
            ),
        ]
    )  # fmt: skip


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
        f"interleaved; {f['slots']} slots, {s_(f['call_latency_s'])} per call.",
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
            *_scale_repeats(f),
        ]
    )


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


def cli_start(f: dict[str, Any]) -> str:
    def runs_row(label: str, runs: list[dict[str, Any]], key: str, fmt: Callable[[Any], str] = s_) -> list[str]:
        vals = [r[key] for r in runs if r.get(key) is not None]
        return [label, f"{fmt(statistics.median(vals)) if vals else 'n/a'} ({span(vals, fmt)})"]

    first = f["first_collection"]
    rows = [
        runs_row("first collection, no Prefect server configured (direct): wall", first, "wall_s"),
        runs_row("... the flow's own wall time", first, "flow_wall_s"),
        runs_row("... wall / flow (goal <= 2)", first, "ratio_to_flow", x_),
        runs_row("... lines shown", first, "lines", num),
        runs_row("rerun of the finished collection", first, "rerun_wall_s"),
    ]
    med = f["median"]
    verdict_text = f"goal (wall at most twice the flow's): {verdict(med['ratio_to_flow'], 2.0, '<=')}"
    if "with_running_server" in f:
        srv = f["with_running_server"]
        rows += [
            runs_row("first collection, running server (`PREFECT_API_URL`): wall", srv, "wall_s"),
            runs_row("... the flow's own wall time", srv, "flow_wall_s"),
            runs_row("... wall / flow", srv, "ratio_to_flow", x_),
        ]
        verdict_text += (
            f"; with a running server: {verdict(f['with_running_server_median']['ratio_to_flow'], 2.0, '<=')}"
        )
    cold = f["cold_first_collection"]
    rows.append(["the first command ever (Prefect's database migrated)", s_(cold["wall_s"])])
    err_rows = [[name.replace("_", " "), f"{s_(e['wall_s'])}", e["exit"], e["lines"], code(e["line"][:160])]
                for name, e in f["errors"].items()]  # fmt: skip
    return "\n\n".join(
        [
            f"{len(first)} run(s) of each; medians (min-max). {verdict_text}.",
            table(["measurement", "result"], rows),
            "Errors decided before anything starts:",
            table(["case", "wall", "exit", "lines", "last line"], err_rows),
        ]
    )


def restart(f: dict[str, Any]) -> str:
    clean = f["uninterrupted"]
    rows = [["none (uninterrupted)", "n/a", "n/a", s_(clean["wall_s"]), "n/a", num(clean["failed_rollouts"]), "n/a"]]
    for r in f["restarts"]:
        rows.append(
            [
                s_(r["down_s"]),
                s_(r["down_for_s"]),
                s_(r["back_after_up_s"]),
                s_(r["wall_s"]),
                f"+{s_(r['extra_wall_s'])}",
                num(r["failed_rollouts"]),
                "yes" if r["batch_equal"] else "**no**",
            ]
        )
    head = [
        "server down",
        "kill to /health",
        "/health to first answer",
        "wall",
        "over uninterrupted",
        "failed rollouts",
        "batch equal, bit for bit",
    ]
    lines = [r["outage_lines"] for r in f["restarts"] if r["outage_lines"]]
    shown = "\n".join(f"    {line}" for line in lines[-1]) if lines else "    (none)"
    return "\n\n".join(
        [
            f"{clean['rollouts']} rollouts, {clean['requests']} model calls uninterrupted; the server killed after "
            "half of them. Goal: a 90 s outage costs no rerun.",
            table(head, rows),
            "What the operator sees (the longest outage):",
            shown,
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


RENDERERS: dict[str, Callable[[Any], str]] = {
    "local_model": local_model,
    "batch_write": batch_write,
    "writer_race": writer_race,
    "estimator_quality": estimator_quality,
    "estimator_quality_heldout": estimator_quality_heldout,
    "learning": learning,
    "load_2k": load,
    "load_20k": load,
    "load_tinylm": load,
    "train_local": train_local,
    "engine": engine,
    "orchestration": orchestration,
    "search_planning_scan": search_planning_scan,
    "search_planning": search_planning,
    "scale": scale,
    "http_client": http_client,
    "cli_start": cli_start,
    "restart": restart,
    "fleet": fleet,
    "waves": waves,
}


# -- the README ----------------------------------------------------------------------------------


def block(name: str, results: Path, warnings: list[str]) -> str:
    """The inside of block ``name`` (without its markers)."""
    if name == SUMMARY:
        return summary(results)
    rec = read(name, results)
    if rec is None:
        return not_run(name)
    try:
        body = RENDERERS[name](rec["figures"])
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
        warnings.append(f"{name}: the record does not have what the renderer reads ({type(e).__name__}: {e})")
        body = (
            f"_results/{name}.json does not have what benchmarks/readme.py reads "
            f"({type(e).__name__}: {e}); the benchmark's figures changed: fix its renderer._"
        )
    return f"{run_line(rec)}\n\n{body}"


def summary(results: Path) -> str:
    rows, total, machines = [], 0.0, []
    for b in REGISTRY:
        rec = read(b.name, results)
        if rec is None:
            rows.append([b.name, "not run on this machine yet", "", "", ""])
            continue
        total += rec["wall_s"]
        m = machine_text(rec["machine"])
        if m not in machines:
            machines.append(m)
        load = [(rec.get("load_average_before") or [None])[0], rec.get("load_average_max_during"),
                (rec.get("load_average_after") or [None])[0]]  # fmt: skip
        rows.append(
            [
                b.name + (" (smoke run)" if rec.get("quick") else ""),
                rec["started_utc"].replace("T", " ")[:16],
                code(str(rec.get("git_commit"))),
                duration(rec["wall_s"]),
                " / ".join(num(x) for x in load),
            ]
        )
    done = sum(1 for b in REGISTRY if read(b.name, results) is not None)
    took = f"; their runs took {duration(total)} together" if done else ""
    rest = " (the others are not counted)" if 0 < done < len(REGISTRY) else ""
    lines = [
        table(["benchmark", "run (UTC)", "commit", "wall", "load average before / max during / after"], rows),
        f"{done} of {len(REGISTRY)} benchmarks recorded{took}{rest}.",
    ]
    if machines:
        lines.append("Machine" + ("s" if len(machines) > 1 else "") + ": " + "; ".join(machines) + ".")
    return "\n\n".join(lines)


def blocks(text: str) -> list[str]:
    """Names of the generated blocks in ``text``, in order."""
    return [m.group("name") for m in BLOCK.finditer(text)]


def problems(text: str) -> list[str]:
    """What is wrong with the README's blocks: a benchmark of the registry without its
    block, a block twice, a block of no benchmark, a marker without its pair."""
    names = blocks(text)
    out = [f"no generated block for {b.name}" for b in REGISTRY if b.name not in names]
    out += [f"block {n} appears {names.count(n)} times" for n in sorted(set(names)) if names.count(n) > 1]
    out += [f"block {n} names no benchmark" for n in names if n != SUMMARY and n not in BY_NAME]
    opened = len(re.findall(r"^<!-- generated: [\w-]+ -->$", text, re.M))
    closed = len(re.findall(r"^<!-- end generated: [\w-]+ -->$", text, re.M))
    if opened != len(names) or closed != len(names):
        out.append(f"{opened} opening and {closed} closing markers, {len(names)} paired blocks")
    return out


def render(text: str, results: Path = RESULTS) -> tuple[str, list[str]]:
    """``text`` with every generated block rendered from the records in ``results``, and
    warnings (blocks that could not be rendered, blocks missing or unknown)."""
    warnings = problems(text)

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name != SUMMARY and name not in BY_NAME:
            return m.group(0)
        return f"<!-- generated: {name} -->\n{block(name, results, warnings)}\n<!-- end generated: {name} -->"

    return BLOCK.sub(sub, text), warnings
