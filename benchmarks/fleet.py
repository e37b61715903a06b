"""A fleet of model replicas: FOCUS's tree routing against round-robin and a cache-aware router.

The question: with N replicas of one model, each with its own bounded prefix cache, does
routing each call by the search tree (``focus.backends.routing.TreeRouter``: a call goes
where the prefix it continues was computed) keep the prefix-cache hit rate of one server
and N times its throughput, where round-robin (``RoundRobin``) spreads every tree's
prefixes over all replicas and a cache-aware router in the style of SGLang's
(``CacheAwareRouter``, from its documentation) has to guess prefixes from prompts? And
does a replica killed mid-collection cost anything?

Servers: simulated model servers (``focus/testing/simserver.py``), one process each, with
a prefix cache of ``--cache-tokens`` tokens in blocks (least recently used evicted, as
vLLM's automatic prefix caching) and a prefill cost per prompt token not served from it
(``--prefill-ms`` per token), ``--slots`` requests served at once for ``--latency-ms``
each (slow enough that the collecting process is far from its CPU limit on a loaded
machine: its CPU share is reported). The workload grows with N (weak scaling):
``--tasks`` toy tasks per replica, a Selective search (2 evidence rollouts per task,
then ``--transitions`` per replica), ``--concurrency`` rollouts in flight per replica,
continuation waves of ``--wave`` times that many jobs. Each router is tuned alike at
N = 4 (``--scan``: FOCUS's ``balance``, the cache-aware router's ``balance_abs`` and
``cache_threshold``; the best throughput of each kept) and run as N grows, beside the
*unsplit* server: one server with N times the slots and the cache on the same workload,
the capacity of the fleet without the split (what routing can at best match). The same
at N = 1 and 4 with waves as large as the rollouts in flight (the pipeline's default
shape, where each wave's tail grows with N for every router alike). Then N = 4 with
FOCUS's routing with one replica killed (SIGKILL, not restarted) after a third of its
calls: failed rollouts, and whether the batch equals the uninterrupted one bit for bit.
With ``--tinylm``, the hit rates of the three routers over N embedded tiny-model servers
too (real prefix caches, real compute; their throughput is this machine's CPU).

Figures per run: prefix-cache hit rate (prompt tokens the servers served from cache /
prompt tokens sent, as the servers report them), prefill tokens computed, throughput
(transitions per second) and its ratios to N x the one-replica run and to the unsplit
server, the load spread (busiest replica's calls / mean), failed rollouts.

    python -m benchmarks.fleet [--replicas 1,2,4,8] [--scan] [--tinylm] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.results import machine, write_report
from focus.agent import Agent
from focus.backends import FleetPolicy, HttpConfig, OpenAICompatPolicy
from focus.backends.routing import CacheAwareRouter, RoundRobin, Router, TreeRouter
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import SamplingParams
from focus.priority import Phase, Selective
from focus.testing.faults import ServerRestart
from focus.testing.simserver import SimConfig, SimServerProcess
from focus.toy import ReachTarget, reach_target_tasks, toy_format

#: Quick retries: a dead replica fails over within a second.
HTTP = HttpConfig(max_retries=4, backoff_s=0.01, backoff_max_s=0.2, timeout_s=60)


def make_router(kind: str, replicas: int, knob: dict[str, float]) -> Router:
    if kind == "focus":
        return TreeRouter(balance=knob.get("balance", 0.25), slack=int(knob.get("slack", 2)))
    if kind == "round_robin":
        return RoundRobin()
    return CacheAwareRouter(
        replicas,
        cache_threshold=knob.get("cache_threshold", 0.5),
        balance_abs=int(knob.get("balance_abs", 32)),
        block=4,
    )


def collect(
    urls: list[str], router: Router, args: argparse.Namespace, scale: int | None = None
) -> tuple[Any, FleetPolicy, float, float]:
    """One collection over the replicas at ``urls``, its workload that of ``scale``
    replicas (default: as many as ``urls``): (batch, policy, wall and CPU seconds)."""
    n = scale or len(urls)
    policy = FleetPolicy(
        [OpenAICompatPolicy(u, vocab_size=ByteCodec.vocab_size, config=HTTP) for u in urls], router, down_s=5.0
    )
    agent = Agent(policy, ReachTarget(), toy_format(), max_steps=8, sampling=SamplingParams(max_tokens=8))
    in_flight = args.concurrency * n
    phases = [
        Phase("evidence", rollouts_per_task=2),
        Phase("continue", transitions=args.transitions * n, wave_size=args.wave * in_flight, max_depth=8),
    ]
    col = Collector(
        agent,
        search=Selective(phases=phases),
        critic=ConstantCritic(0.5),
        execution=Execution(max_concurrency=in_flight),
        collection_id="fleet",
        seed=3,
    )

    async def go() -> Any:
        try:
            return await col.collect(reach_target_tasks(args.tasks * n, seed=1))
        finally:
            await policy.aclose()

    t0, c0 = time.perf_counter(), time.process_time()
    batch = asyncio.run(go())
    return batch, policy, time.perf_counter() - t0, time.process_time() - c0


def figures(batch: Any, policy: FleetPolicy, wall: float, cpu: float) -> dict[str, Any]:
    s = policy.stats()
    calls = [r["calls"] for r in s["replicas"]]
    return {
        "wall_s": round(wall, 2),
        # the collecting process's CPU over the wall time: well under 1, the client is not the limit
        "client_cpu_share": round(cpu / wall, 3),
        "transitions": batch.stats["transitions"],
        "throughput": round(batch.stats["transitions"] / wall, 2),
        "calls": s["calls"],
        "prompt_tokens": s["prompt_tokens"],
        "prefill_tokens": s["prompt_tokens"] - s["cached_tokens"],
        "hit_rate": s["cache_hit_ratio"],
        "load_spread": round(max(calls) / (sum(calls) / len(calls)), 3) if sum(calls) else None,
        "failed_rollouts": batch.stats["failed_rollouts"],
        "failovers": s["failovers"],
        "per_replica": s["replicas"],
    }


def rows(batch: Any) -> tuple[list[Any], list[Any]]:
    actor = [(r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, r.logprobs) for r in batch.actor]
    return actor, [(r.tree_id, r.node_id, r.context_ids, r.target, r.weight) for r in batch.critic]


class Replicas:
    """Simulated servers, started once and emptied between runs."""

    def __init__(self, config: SimConfig, n: int) -> None:
        self.servers = [SimServerProcess(config).start() for _ in range(n)]

    def first(self, n: int) -> list[str]:
        for s in self.servers[:n]:
            if s.proc is None:
                s.start()  # killed by an earlier run: back on its port
            s.flush_cache()
            s.reset()
        return [s.url for s in self.servers[:n]]

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


def run(
    sims: Replicas, n: int, kind: str, knob: dict[str, float], args: argparse.Namespace, log: Callable[[str], None]
) -> dict[str, Any]:
    batch, policy, wall, cpu = collect(sims.first(n), make_router(kind, n, knob), args)
    out = figures(batch, policy, wall, cpu)
    log(
        f"N={n} {kind} {knob}: {out['throughput']} transitions/s, hit rate {out['hit_rate']}, {wall:.1f} s, "
        f"client CPU {out['client_cpu_share']}"
    )
    return out


def scan(sims: Replicas, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, dict[str, float]]:
    """Each router's knobs at N = 4 (or the largest N), the best throughput kept."""
    n = min(4, max(args.replicas))
    grid: dict[str, list[dict[str, float]]] = {
        "focus": [{"balance": b} for b in (0.1, 0.25, 0.5)],
        "round_robin": [{}],
        "cache_aware": [
            {"balance_abs": a, "cache_threshold": t} for a in (4, args.concurrency, 32) for t in (0.3, 0.5)
        ],
    }
    best: dict[str, dict[str, float]] = {}
    for kind, knobs in grid.items():
        if not args.scan:
            knobs = knobs[1:2] if kind == "focus" else knobs[:1] if kind == "round_robin" else knobs[3:4]
        results = [(run(sims, n, kind, k, args, log)["throughput"], k) for k in knobs]
        best[kind] = max(results, key=lambda r: r[0])[1]
    return best


def unsplit(sim: SimConfig, n: int, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """The workload of ``n`` replicas on one server with ``n`` times the slots and cache:
    the same capacity, not split (what routing over replicas can at best match)."""
    big = sim.model_copy(update={"slots": n * sim.slots, "cache_capacity_tokens": n * sim.cache_capacity_tokens})
    with SimServerProcess(big) as server:
        batch, policy, wall, cpu = collect([server.url], TreeRouter(), args, scale=n)
    out = figures(batch, policy, wall, cpu)
    log(f"N={n} unsplit: {out['throughput']} transitions/s, hit rate {out['hit_rate']}, {wall:.1f} s")
    return out


def kill_run(sims: Replicas, knob: dict[str, float], args: argparse.Namespace) -> dict[str, Any]:
    """N = 4 with FOCUS's routing, twice: clean, then with replica 1 killed mid-collection."""
    urls = sims.first(4)
    clean, policy, wall, _ = collect(urls, make_router("focus", 4, knob), args)
    calls = policy.stats()["replicas"][1]["calls"]
    urls = sims.first(4)
    with ServerRestart(sims.servers[1], after_requests=max(1, calls // 3), down_s=None) as restart:
        killed, kpolicy, kwall, kcpu = collect(urls, make_router("focus", 4, knob), args)
    out = figures(killed, kpolicy, kwall, kcpu)
    out["killed_after_calls"] = restart.requests_at_kill
    out["clean_throughput"] = round(clean.stats["transitions"] / wall, 2)
    out["batch_equal"] = rows(killed) == rows(clean)
    return out


def tinylm_runs(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    from focus.backends.local import LocalModelServer

    out: dict[str, Any] = {}
    small = argparse.Namespace(**{**vars(args), "tasks": 3, "transitions": 30, "concurrency": 6})
    servers = [LocalModelServer(extra_args=["--prefix-cache-tokens", "3000"]).start() for _ in range(4)]
    try:
        for n in (1, 2, 4):
            for kind in ("focus", "round_robin", "cache_aware"):
                for s in servers:
                    import httpx

                    httpx.post(f"{s.url}/flush_cache", timeout=30).raise_for_status()
                batch, policy, wall, cpu = collect([s.url for s in servers[:n]], make_router(kind, n, {}), small)
                out[f"{n}/{kind}"] = figures(batch, policy, wall, cpu)
                log(f"tinylm N={n} {kind}: hit rate {out[f'{n}/{kind}']['hit_rate']}")
    finally:
        for s in servers:
            s.stop()
    return out


def sweep(
    sims: Replicas,
    sim: SimConfig,
    args: argparse.Namespace,
    knobs: dict[str, dict[str, float]],
    log: Callable[[str], None],
    sizes: tuple[int, ...] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every router at every fleet size, beside the unsplit server; ratios to N = 1."""
    runs: dict[str, dict[str, Any]] = {}
    for n in sizes or args.replicas:
        for kind in ("focus", "round_robin", "cache_aware"):
            runs[f"{n}/{kind}"] = run(sims, n, kind, knobs[kind], args, log)
        if n > 1:
            runs[f"{n}/unsplit"] = unsplit(sim, n, args, log)
    one = runs.get("1/focus")
    for key, r in runs.items():
        n = int(key.split("/")[0])
        if one:
            r["throughput_vs_n_x_one"] = round(r["throughput"] / (n * one["throughput"]), 3)
            r["hit_rate_vs_one"] = round(r["hit_rate"] / one["hit_rate"], 3) if one["hit_rate"] else None
        big = runs.get(f"{n}/unsplit")
        if big and not key.endswith("unsplit"):
            r["throughput_vs_unsplit"] = round(r["throughput"] / big["throughput"], 3)
    return runs


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--replicas", default="1,2,4,8", help="fleet sizes, comma-separated")
    ap.add_argument("--tasks", type=int, default=6, help="toy tasks per replica")
    ap.add_argument("--transitions", type=int, default=150, help="continuation budget per replica")
    ap.add_argument("--concurrency", type=int, default=12, help="rollouts in flight per replica")
    ap.add_argument("--wave", type=int, default=3, help="continuation jobs per wave, in multiples of those in flight")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, default=500.0)
    ap.add_argument("--prefill-ms", type=float, default=10.0, help="per prompt token not served from the cache")
    ap.add_argument("--cache-tokens", type=int, default=4000, help="each replica's prefix cache")
    ap.add_argument("--scan", action="store_true", help="tune every router's knobs at N = 4 first")
    ap.add_argument("--tinylm", action="store_true", help="also the embedded tiny-model servers (hit rates)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.replicas = [int(x) for x in args.replicas.split(",") if x]

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    sim = SimConfig(
        slots=args.slots,
        latency_s=args.latency_ms / 1000,
        completion_tokens=3,
        cache_capacity_tokens=args.cache_tokens,
        cache_block_tokens=4,
        prefill_s_per_token=args.prefill_ms / 1000,
        version="w0",
    )
    report: dict[str, Any] = {
        "command": "python -m benchmarks.fleet " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "sim": sim.model_dump(),
        "per_replica": {"tasks": args.tasks, "transitions": args.transitions, "concurrency": args.concurrency},
        "wave": args.wave,
    }
    sims = Replicas(sim, max([*args.replicas, 4]))
    try:
        knobs = scan(sims, args, log)
        report["knobs"] = knobs
        report["runs"] = sweep(sims, sim, args, knobs, log)
        # the shape of the default pipeline, waves as large as the rollouts in flight
        report["waves_of_one"] = sweep(sims, sim, argparse.Namespace(**{**vars(args), "wave": 1}), knobs, log, (1, 4))
        report["kill"] = kill_run(sims, knobs["focus"], args)
        log(f"kill run: {report['kill']['failed_rollouts']} failed, batch equal {report['kill']['batch_equal']}")
    finally:
        sims.stop()
    if args.tinylm:
        report["tinylm"] = tinylm_runs(args, log)
    return write_report(report, args.json)


if __name__ == "__main__":
    main()
