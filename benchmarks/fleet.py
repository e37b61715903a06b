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
each. The workload grows with N (weak scaling): ``--tasks`` toy tasks per replica, a
Selective search (2 evidence rollouts per task, then ``--transitions`` per replica in
waves of the calls in flight), ``--concurrency`` rollouts in flight per replica. Every
router is tuned alike at N = 4 (``--scan``: FOCUS's ``balance``, the cache-aware
router's ``balance_abs`` and ``cache_threshold``; the best throughput of each is kept)
and run as N grows. Then one run at N = 4 with FOCUS's routing in which one replica is
killed (SIGKILL, not restarted) after a third of its calls: failed rollouts, and whether
the batch equals the uninterrupted one bit for bit. With ``--tinylm``, the hit rates of
the three routers over N embedded tiny-model servers too (real prefix caches and real
compute; their throughput is the machine's CPU, not a figure of the routing).

Figures per run: prefix-cache hit rate (prompt tokens the servers served from cache /
prompt tokens sent, as the servers report them), prefill tokens computed, throughput
(transitions per second), its ratio to N x the one-replica run's, the load spread
(busiest replica's calls / mean), failed rollouts.

    python -m benchmarks.fleet [--replicas 1,2,4,8] [--tasks 6] [--transitions 120]
        [--concurrency 12] [--scan] [--tinylm] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.http_client import machine
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
        return TreeRouter(balance=knob.get("balance", 0.25))
    if kind == "round_robin":
        return RoundRobin()
    return CacheAwareRouter(
        replicas,
        cache_threshold=knob.get("cache_threshold", 0.5),
        balance_abs=int(knob.get("balance_abs", 32)),
        block=4,
    )


def collect(urls: list[str], router: Router, args: argparse.Namespace) -> tuple[Any, FleetPolicy, float]:
    """One collection over the replicas at ``urls``: (batch, policy, wall seconds)."""
    n = len(urls)
    policy = FleetPolicy(
        [OpenAICompatPolicy(u, vocab_size=ByteCodec.vocab_size, config=HTTP) for u in urls], router, down_s=5.0
    )
    agent = Agent(policy, ReachTarget(), toy_format(), max_steps=8, sampling=SamplingParams(max_tokens=8))
    in_flight = args.concurrency * n
    phases = [
        Phase("evidence", rollouts_per_task=2),
        Phase("continue", transitions=args.transitions * n, wave_size=in_flight, max_depth=8),
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

    t0 = time.perf_counter()
    batch = asyncio.run(go())
    return batch, policy, time.perf_counter() - t0


def figures(batch: Any, policy: FleetPolicy, wall: float) -> dict[str, Any]:
    s = policy.stats()
    calls = [r["calls"] for r in s["replicas"]]
    return {
        "wall_s": round(wall, 2),
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
    batch, policy, wall = collect(sims.first(n), make_router(kind, n, knob), args)
    out = figures(batch, policy, wall)
    log(f"N={n} {kind} {knob}: {out['throughput']} transitions/s, hit rate {out['hit_rate']}, {wall:.1f} s")
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


def kill_run(sims: Replicas, knob: dict[str, float], args: argparse.Namespace) -> dict[str, Any]:
    """N = 4 with FOCUS's routing, twice: clean, then with replica 1 killed mid-collection."""
    urls = sims.first(4)
    clean, policy, wall = collect(urls, make_router("focus", 4, knob), args)
    calls = policy.stats()["replicas"][1]["calls"]
    urls = sims.first(4)
    with ServerRestart(sims.servers[1], after_requests=max(1, calls // 3), down_s=None) as restart:
        killed, kpolicy, kwall = collect(urls, make_router("focus", 4, knob), args)
    out = figures(killed, kpolicy, kwall)
    out["killed_after_calls"] = restart.requests_at_kill
    out["clean_throughput"] = round(clean.stats["transitions"] / wall, 2)
    out["batch_equal"] = rows(killed) == rows(clean)
    return out


def tinylm_runs(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    from focus.backends.local import LocalModelServer

    out: dict[str, Any] = {}
    small = argparse.Namespace(**{**vars(args), "tasks": 3, "transitions": 30, "concurrency": 6})
    servers = [LocalModelServer(extra_args=["--prefix-cache-tokens", "20000"]).start() for _ in range(4)]
    try:
        for n in (1, 2, 4):
            for kind in ("focus", "round_robin", "cache_aware"):
                for s in servers:
                    import httpx

                    httpx.post(f"{s.url}/flush_cache", timeout=30).raise_for_status()
                batch, policy, wall = collect([s.url for s in servers[:n]], make_router(kind, n, {}), small)
                out[f"{n}/{kind}"] = figures(batch, policy, wall)
                log(f"tinylm N={n} {kind}: hit rate {out[f'{n}/{kind}']['hit_rate']}")
    finally:
        for s in servers:
            s.stop()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--replicas", default="1,2,4,8", help="fleet sizes, comma-separated")
    ap.add_argument("--tasks", type=int, default=6, help="toy tasks per replica")
    ap.add_argument("--transitions", type=int, default=120, help="continuation budget per replica")
    ap.add_argument("--concurrency", type=int, default=12, help="rollouts in flight per replica")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--prefill-ms", type=float, default=2.0, help="per prompt token not served from the cache")
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
    }
    sims = Replicas(sim, max([*args.replicas, 4]))
    try:
        knobs = scan(sims, args, log)
        report["knobs"] = knobs
        runs: dict[str, dict[str, Any]] = {}
        for n in args.replicas:
            for kind in ("focus", "round_robin", "cache_aware"):
                runs[f"{n}/{kind}"] = run(sims, n, kind, knobs[kind], args, log)
        one = {k: runs[f"1/{k}"] for k in knobs if f"1/{k}" in runs}
        for key, r in runs.items():
            n_s, kind = key.split("/")
            base = one.get(kind) or one.get("focus")
            if base:
                r["throughput_vs_n_x_one"] = round(r["throughput"] / (int(n_s) * base["throughput"]), 3)
                r["hit_rate_vs_one"] = round(r["hit_rate"] / base["hit_rate"], 3) if base["hit_rate"] else None
        report["runs"] = runs
        report["kill"] = kill_run(sims, knobs["focus"], args)
        log(f"kill run: {report['kill']['failed_rollouts']} failed, batch equal {report['kill']['batch_equal']}")
    finally:
        sims.stop()
    if args.tinylm:
        report["tinylm"] = tinylm_runs(args, log)
    text = json.dumps(report, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)
    return report


if __name__ == "__main__":
    main()
