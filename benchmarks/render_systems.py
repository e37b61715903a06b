"""README renderers of the serving and storage benchmarks: the embedded model, batch
writes, racing writers, load under faults, the local trainer, CLI start-up, restarts."""

from __future__ import annotations

import statistics
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
    unit,
    verdict,
    x_,
)

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
    from focus.train_local import UpdateConfig

    settings = [s for s in f["settings"] if s.get("rule", "adam") == "adam"]
    base = next((s for s in settings if s["pack"] in (False, "none") and s["torch_threads"] == 2), settings[0])
    default = UpdateConfig().pack
    rows = [
        [
            f"pack={s['pack']} threads={s['torch_threads']}" + (" (the default layout and threads)" if s["pack"] == default and s["torch_threads"] == 1 else ""),
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
            table(["setting", "median", "each run", f"speed-up vs pack={base['pack']} threads={base['torch_threads']}"], rows),
            *_train_layouts(f),
        ]
    )  # fmt: skip


def _train_layouts(f: dict[str, Any]) -> list[str]:
    """The one-step (``sgd``) rows: the same update under each sequence layout."""
    steps = [s for s in f["settings"] if s.get("rule", "adam") != "adam"]
    if not steps:
        return []
    base = next((s for s in steps if s["pack"] == "none"), steps[0])
    rows = [
        [f"pack={s['pack']}", s_(s["median_s"]), each(s["runs_s"], s_), x_(base["median_s"] / s["median_s"])]
        for s in steps
    ]
    head = (
        f'One step sized to KL 0.2 (`rule="sgd"`, the default rule at the learning benchmark\'s step), one thread: token trie '
        f'(`pack="tree"`, the whole batch\'s trie): {f["tree_pieces"]:,} pieces ({f["tree_tokens"]:,} tokens).'
    )
    return [head, table(["layout", "median", "each run", "speed-up vs pack=none"], rows)]


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
