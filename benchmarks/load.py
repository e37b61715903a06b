"""Load under faults: collections against a loopback model server with injected faults.

A fault proxy (``focus/testing/faults.py``, in a process of its own like the server: it
stands for the network and the service, whose CPU is not the collector's) sits in front
of the model server and injects every fault kind at ``--fault-rate`` of the generation requests (429, 5xx,
answers that hang past the client's timeout, closed and reset connections, non-JSON
bodies, short and NaN log-probs). The collection runs as the pipeline runs it - the
HTTP client with the library's defaults (``focus.backends.RetryPolicy``: 120 s timeout,
jittered backoff, deadline, adaptive hedging; only ``max_concurrency`` is set, to the
execution's, as ``tasks.config`` does), waves planned ahead as
``search.waves_in_flight`` says (the pipeline's default), through the library's own
steps (``Collector.run_evidence``, ``advance``, ``score``) - evidence, then one
continuation phase sized to reach the transitions asked. A ``timeout`` fault holds its
request for 1.5 x the client's timeout (180 s with the defaults).

Each size runs ``--repeats`` pairs: the collection without faults, then the same
collection with faults, in the same process (a change in the machine's load between
pairs moves both runs of a pair alike). With retries succeeding both must give the same
batch (rows lost 0, duplicated 0), and ``wall_ratio`` (faulty / clean wall time; goal
<= 1.3) says what the faults cost the collection; the report gives its median and
range over the repeats, the faults injected by kind, what the client did about them
(retries by cause, hedges, seconds lost: ``HttpClient.stats``), the same as the
rollouts' usage records count them (``batch.stats``), the hedges the clean runs sent
(each one a request sent for nothing) and resident memory against transitions.

``--set FIELD=VALUE`` changes a field of the client's policy (``--set
adaptive_hedge=false``, ``--set hedge_after_s=0.25``); such a run is not the defaults,
and the report and its JSON say so under ``client_overrides``.

Server: ``sim`` (focus/testing/simserver.py: 10 ms per call, no model; the default, so
20k transitions take seconds) or ``tinylm`` (the embedded tiny model; ~50 transitions/s
on 2 cores). With ``tinylm`` each run also counts the tokens the server decoded (its
``/metrics``) per token stored in the batch, and the requests it aborted because their
client had gone: faults make the client retry and hedge, and every attempt it abandons
(a hedge that lost, an attempt that timed out) reaches the server as a hang-up that the
proxy passes on, after which the server decodes nothing more for it.

Run: ``python -m benchmarks.load [--transitions 2000 20000] [--repeats 3] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import pickle
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from benchmarks.results import git_commit, load_average, machine
from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.collector import Collector, Running
from focus.critic import ConstantCritic
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import SamplingParams
from focus.priority import Phase, Selective
from focus.testing.faults import FaultProxyProcess
from focus.toy import ReachTarget, reach_target_tasks, toy_format
from tasks.config import SearchConfig

#: A ``timeout`` fault holds its request this many times the client's timeout.
HANG_FACTOR = 1.5


def rss_bytes() -> tuple[int, int]:
    """(current resident set, its high-water mark) of this process, from /proc."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            fields[k] = int(v.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def client_config(concurrency: int, overrides: dict[str, Any] | None = None) -> HttpConfig:
    """The library's client defaults, with as many calls in flight as rollouts (what
    ``tasks.config`` builds for the pipeline), plus any explicit overrides."""
    return HttpConfig(**{**(overrides or {}), "max_concurrency": concurrency})


def make_collector(
    url: str, transitions: int, n_tasks: int, concurrency: int, http: HttpConfig, waves_in_flight: int
) -> Collector:
    policy = OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size, config=http)
    agent = Agent(policy, ReachTarget(), toy_format(), max_steps=8, sampling=SamplingParams(max_tokens=8))
    evidence = 2
    phases = [
        Phase("evidence", rollouts_per_task=evidence),
        Phase("continue", transitions=max(1, transitions - n_tasks * evidence * 2), wave_size=256, max_depth=8),
    ]
    return Collector(
        agent,
        search=Selective(phases=phases, waves_in_flight=waves_in_flight),
        critic=ConstantCritic(0.5),
        execution=Execution(max_concurrency=concurrency),
        collection_id="load",
        seed=0,
    )


async def run_collection(col: Collector, n_tasks: int) -> tuple[Any, list[dict[str, float]]]:
    """Every phase, wave by wave, sampling memory after each wave."""
    samples = []
    t0 = time.perf_counter()

    def sample(state: Any) -> None:
        rss, hwm = rss_bytes()
        used = state.usage()
        samples.append({"transitions": used.transitions, "rss": rss, "peak_rss": hwm, "s": time.perf_counter() - t0})

    running = Running()
    try:
        state = await col.run_evidence(reach_target_tasks(n_tasks, seed=0))
        sample(state)
        while True:
            state, landed = await col.advance(state, 1, running)
            if landed is None:
                break
            state = await col.score(state)
            sample(state)
    finally:
        await running.cancel()
        await col.agent.policy.aclose()
    return state, samples


def run(
    url: str,
    *,
    transitions: int,
    fault_rate: float,
    n_tasks: int,
    concurrency: int,
    seed: int = 0,
    http: HttpConfig | None = None,
    waves_in_flight: int | None = None,
) -> dict[str, Any]:
    """One collection through a fault proxy at ``fault_rate``; its figures and its batch."""
    http = http or client_config(concurrency)
    waves = SearchConfig().waves_in_flight if waves_in_flight is None else waves_in_flight
    gc.collect()
    with FaultProxyProcess(url, rate=fault_rate, seed=seed, hang_s=http.timeout_s * HANG_FACTOR) as proxy:
        col = make_collector(proxy.url, transitions, n_tasks, concurrency, http, waves)
        before = server_counts(url)
        t0, c0 = time.perf_counter(), time.process_time()
        state, samples = asyncio.run(run_collection(col, n_tasks))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        batch = col.prepare(state)
        after = _settled_counts(url)
    keys = [(r.tree_id, r.edge_id, r.turn_index) for r in batch.actor]
    client = col.agent.policy.stats()
    delays = col.agent.policy.http.hedge_delays()
    st = batch.stats
    return {
        "fault_rate": fault_rate,
        "transitions": st["transitions"],
        "rollouts": st["rollouts"],
        "waves": len(state.waves),
        "failed_rollouts": st["failed_rollouts"],
        "failure_causes": st["failure_causes"],
        "failed_trees": st["failed_trees"],
        "requests": proxy.requests,
        "faults_injected": dict(sorted(proxy.injected.items())),
        # what the HTTP client did: retries by cause, hedges, seconds lost (HttpClient.stats)
        "client": client,
        "retries": client["retries"],
        # the adaptive hedge delay at the end of the run (docs/model-services.md, "Hedging")
        "hedge_delay_s": delays,
        # the same retries as the rollouts' usage records count them (batch.stats)
        "usage": {k: st[k] for k in ("retried_calls", "retries", "retry_s", "retry_causes")},
        "actor_rows": len(batch.actor),
        "duplicated_rows": len(keys) - len(set(keys)),
        "wall_s": round(wall, 3),
        # this process's CPU (the collection; proxy and server run elsewhere): unlike wall
        # time, it hardly moves with the machine's load
        "cpu_s": round(cpu, 2),
        "transitions_per_s": round(st["transitions"] / wall, 1),
        "state_pickle_bytes": len(pickle.dumps(state)),
        "memory": samples,
        "peak_rss": max(s["peak_rss"] for s in samples),
        "server_tokens": server_tokens(before, after, sum(len(r.completion_ids) for r in batch.actor)),
        "_batch": batch,
        "_rollout_walls": {(ti, r.rollout): r.wall_s for ti, t in enumerate(state.trees) for r in t.log},
    }


def server_counts(url: str) -> dict[str, float] | None:
    """Tokens decoded, requests running and requests aborted so far, from a vLLM-style
    ``/metrics`` page (None for a server without one: the simulated server)."""
    try:
        resp = httpx.get(f"{url}/metrics", timeout=30)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    from prometheus_client.parser import text_string_to_metric_families

    out = {"decoded": 0.0, "running": 0.0, "aborted": 0.0}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            if s.name == "vllm:generation_tokens_total":
                out["decoded"] += s.value
            elif s.name == "vllm:num_requests_running":
                out["running"] += s.value
            elif s.name == "vllm:request_success_total" and s.labels.get("finished_reason") == "abort":
                out["aborted"] += s.value
    return out


def _settled_counts(url: str, within_s: float = 30.0) -> dict[str, float] | None:
    """The counts once the server runs nothing (abandoned requests still being aborted)."""
    deadline = time.monotonic() + within_s
    while (now := server_counts(url)) is not None and now["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def server_tokens(
    before: dict[str, float] | None, after: dict[str, float] | None, stored: int
) -> dict[str, Any] | None:
    """Tokens the server decoded for the run against the tokens the batch stores."""
    if before is None or after is None:
        return None
    decoded = after["decoded"] - before["decoded"]
    return {
        "decoded": decoded,
        "stored": stored,
        "decoded_per_stored": round(decoded / stored, 4) if stored else None,
        "aborted_requests": after["aborted"] - before["aborted"],
    }


def compare(faulty: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    """Rows lost and duplicated in the faulty batch relative to the clean one."""

    def key(r: Any) -> tuple[Any, ...]:
        return (r.tree_id, r.edge_id, r.turn_index, r.completion_ids, round(r.advantage, 9))

    got = [key(r) for r in faulty["_batch"].actor]
    want = [key(r) for r in clean["_batch"].actor]
    walls, base = faulty["_rollout_walls"], clean["_rollout_walls"]
    # rollouts a fault held up by a second or more (a hang until the timeout, or several
    # retries); smaller differences are the machine's noise as much as faults'
    slowed = [w - base[k] for k, w in walls.items() if k in base and w - base[k] >= 1.0]
    return {
        "identical_batches": got == want,
        "rows_lost": len(set(want) - set(got)),
        "rows_duplicated": len(got) - len(set(got)),
        "wall_ratio": round(faulty["wall_s"] / clean["wall_s"], 3),
        "cpu_ratio": round(faulty["cpu_s"] / clean["cpu_s"], 3),
        "rollouts_held_up_1s_or_more": len(slowed),
        "their_rollout_time_lost_s": round(sum(slowed), 1),
    }


def growth(samples: list[dict[str, float]]) -> float:
    """Resident bytes per transition over the second half of the run (least squares slope)."""
    tail = samples[len(samples) // 2 :]
    if len(tail) < 2:
        return float("nan")
    xs, ys = [s["transitions"] for s in tail], [s["rss"] for s in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def spread(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def public(run_: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run_.items() if not k.startswith("_") and k != "memory"}


def measure_size(url: str, transitions: int, repeats: int, fault_rate: float, common: dict[str, Any]) -> dict[str, Any]:
    """``repeats`` clean/faulty pairs at one size, summarised; the pair with the median
    ratio gives the detailed counts."""
    pairs = []
    for i in range(repeats):
        load_before = load_average()
        clean = run(url, fault_rate=0.0, transitions=transitions, **common)
        faulty = run(url, fault_rate=fault_rate, transitions=transitions, **common)
        cmp = compare(faulty, clean)
        pairs.append((cmp, clean, faulty, [load_before, load_average()]))
        print(
            f"  {transitions:,} transitions, pair {i + 1}/{repeats}: clean {clean['wall_s']:.2f} s, faulty "
            f"{faulty['wall_s']:.2f} s, ratio {cmp['wall_ratio']:.2f}, identical {cmp['identical_batches']}, "
            f"hedges {faulty['client']['hedges']} (clean {clean['client']['hedges']}), load {load_average()}",
            file=sys.stderr,
            flush=True,
        )
    ordered = sorted(pairs, key=lambda p: p[0]["wall_ratio"])
    cmp, clean, faulty, _ = ordered[len(ordered) // 2]
    fc = faulty["client"]
    return {
        "transitions_asked": transitions,
        "transitions": faulty["transitions"],
        "repeats": repeats,
        "clean_wall_s": spread([p[1]["wall_s"] for p in pairs]),
        "faulty_wall_s": spread([p[2]["wall_s"] for p in pairs]),
        "wall_ratio": spread([p[0]["wall_ratio"] for p in pairs]),
        "cpu_ratio": spread([p[0]["cpu_ratio"] for p in pairs]),
        "identical_batches_every_repeat": all(p[0]["identical_batches"] for p in pairs),
        "failed_rollouts_faulty": [p[2]["failed_rollouts"] for p in pairs],
        "load_average_per_pair": [p[3] for p in pairs],
        # the median pair in detail
        "requests": {"clean": clean["requests"], "faulty": faulty["requests"]},
        "faults_injected": faulty["faults_injected"],
        "retries_by_cause": fc["retries"],
        "retry_lost_s_by_cause": fc["lost_s"],
        "hedges": fc["hedges"],
        "hedge_wins": fc["hedge_wins"],
        "hedge_lost_s": fc["hedge_lost_s"],
        "usage_retries": faulty["usage"],
        "clean_hedges_every_repeat": [p[1]["client"]["hedges"] for p in pairs],
        # tokens the server decoded per stored token (tinylm only), every pair
        "server_tokens_clean_every_repeat": [p[1]["server_tokens"] for p in pairs],
        "server_tokens_faulty_every_repeat": [p[2]["server_tokens"] for p in pairs],
        "hedge_delay_s_clean_every_repeat": [p[1]["hedge_delay_s"] for p in pairs],
        "median_pair": {
            **cmp,
            "clean": public(clean),
            "faulty": public(faulty),
            "bytes_per_transition_faulty": round(growth(faulty["memory"])),
            "bytes_per_transition_clean": round(growth(clean["memory"])),
        },
    }


@contextlib.contextmanager
def server(kind: str, concurrency: int) -> Iterator[str]:
    if kind == "tinylm":
        from focus.backends import LocalModelServer

        with LocalModelServer() as s:
            yield s.url
    else:
        from focus.testing.simserver import SimConfig, SimServerProcess

        with SimServerProcess(SimConfig(slots=concurrency, latency_s=0.01)) as s:
            yield s.url


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` pairs (values read as JSON where they parse: numbers, true, null)."""
    out: dict[str, Any] = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or field not in HttpConfig.model_fields:
            raise SystemExit(f"--set wants FIELD=VALUE with a field of HttpConfig, got {item!r}")
        try:
            out[field] = json.loads(value)
        except ValueError:
            out[field] = value
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        "| transitions | clean wall s, median (min-max) | faulty wall s | ratio, median (min-max) | identical "
        "| faults | retries by cause | hedges (won) / clean runs' | lost to retries / to hangs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["sizes"]:
        c, f, q = r["clean_wall_s"], r["faulty_wall_s"], r["wall_ratio"]
        retries = ", ".join(f"{k} {v}" for k, v in sorted(r["retries_by_cause"].items()))
        lines.append(
            f"| {r['transitions']:,} | {c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f}) "
            f"| {f['median']:.2f} ({f['min']:.2f}-{f['max']:.2f}) "
            f"| {q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f}) "
            f"| {'yes' if r['identical_batches_every_repeat'] else 'NO'} "
            f"| {sum(r['faults_injected'].values())} ({r['faults_injected'].get('timeout', 0)} hangs) "
            f"| {retries} | {r['hedges']} ({r['hedge_wins']}) / {max(r['clean_hedges_every_repeat'])} "
            f"| {sum(r['retry_lost_s_by_cause'].values()):.1f} s / {r['hedge_lost_s']:.1f} s |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transitions", type=int, nargs="+", default=[2_000, 20_000])
    ap.add_argument("--fault-rate", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3, help="clean/faulty pairs per size")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=64, help="rollouts and model calls in flight")
    ap.add_argument("--server", choices=["sim", "tinylm"], default="sim")
    ap.add_argument(
        "--waves-in-flight",
        type=int,
        default=SearchConfig().waves_in_flight,
        help="waves planned ahead (default: the pipeline's search.waves_in_flight)",
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="a non-default client field (repeatable)"
    )
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)
    overrides = parse_sets(args.set)
    http = client_config(args.concurrency, overrides)
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.load", *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(),
        "git_commit": git_commit(),
        "load_average_before": load_average(),
        "server": args.server,
        "fault_rate": args.fault_rate,
        "concurrency": args.concurrency,
        "waves_in_flight": args.waves_in_flight,
        "waves_in_flight_is_default": args.waves_in_flight == SearchConfig().waves_in_flight,
        "client": http.model_dump(exclude={"headers", "api_key"}),
        "client_overrides": overrides,
        "client_is_default": not overrides,
        "hang_s": http.timeout_s * HANG_FACTOR,
    }
    common = {
        "n_tasks": args.tasks,
        "concurrency": args.concurrency,
        "http": http,
        "waves_in_flight": args.waves_in_flight,
    }
    sizes = []
    with server(args.server, args.concurrency) as url:
        for n in args.transitions:
            sizes.append(measure_size(url, n, args.repeats, args.fault_rate, common))
    report["sizes"] = sizes
    report["goal_wall_ratio_at_most_1_3"] = all(s["wall_ratio"]["median"] <= 1.3 for s in sizes)
    report["load_average_after"] = load_average()
    report["benchmark_wall_s"] = round(time.perf_counter() - t0, 1)
    label = "library defaults" if not overrides else f"NOT the defaults: {overrides}"
    print(f"client: {label}; waves in flight {args.waves_in_flight}; load {report['load_average_after']}")
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    main()
