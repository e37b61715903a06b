"""Load under faults: a long collection against a loopback model server with injected faults.

A fault proxy (``focus/testing/faults.py``) sits in front of the model server and
injects every fault kind at ``--fault-rate`` of the generation requests (429, 5xx,
timeouts that hang past the client's timeout, closed and reset connections, non-JSON
bodies, short and NaN log-probs). The collection runs in the pipeline's mode - waves
planned ahead (``--waves-in-flight``, default the pipeline's ``search.waves_in_flight``),
through the library's own steps (``Collector.run_evidence``, ``advance``, ``score``) -
evidence, then one continuation phase sized to reach ``--transitions``; after each wave
the process's resident memory is sampled, so the report shows memory against
transitions collected. The same collection without faults runs first in the same
process as the baseline: with retries succeeding, both must give the same batch (rows
lost 0, duplicated 0), faults must not add memory, and ``wall_ratio`` (faulty / clean
wall time; goal <= 1.3) says what the faults cost the collection. The same rollouts run
in both collections (identical batches), so comparing each rollout's wall time between
them shows what faults cost the rollouts themselves: ``rollouts_held_up_1s_or_more`` and
``their_rollout_time_lost_s``.

Server: ``sim`` (focus/testing/simserver.py: fixed latency, no model; the default, so 20k
transitions take minutes) or ``tinylm`` (the embedded tiny model; ~50 transitions/s on
2 cores).

Run: ``python -m benchmarks.load --transitions 20000 --fault-rate 0.1 --json`` (add
``--out FILE`` to write the report; ``--timeout-s`` sets the client's read timeout, 2 s by
default, which a ``timeout`` fault hangs past).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import pickle
import platform
import sys
import time
from pathlib import Path
from typing import Any

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.collector import Collector, Running
from focus.critic import ConstantCritic
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import SamplingParams
from focus.priority import Phase, Selective
from focus.testing.faults import FaultProxy
from focus.toy import ReachTarget, reach_target_tasks, toy_format
from tasks.config import SearchConfig


def rss_bytes() -> tuple[int, int]:
    """(current resident set, its high-water mark) of this process, from /proc."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            fields[k] = int(v.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def make_collector(
    url: str, transitions: int, n_tasks: int, concurrency: int, timeout_s: float, waves_in_flight: int
) -> Collector:
    http = HttpConfig(
        max_retries=6, backoff_s=0.02, backoff_max_s=0.2, timeout_s=timeout_s, max_concurrency=concurrency
    )
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
    timeout_s: float = 2.0,
    waves_in_flight: int = 2,
) -> dict[str, Any]:
    """One collection through a fault proxy at ``fault_rate``; its figures and its batch."""
    gc.collect()
    with FaultProxy(url, rate=fault_rate, seed=seed, hang_s=timeout_s * 1.5) as proxy:
        col = make_collector(proxy.url, transitions, n_tasks, concurrency, timeout_s, waves_in_flight)
        t0, c0 = time.perf_counter(), time.process_time()
        state, samples = asyncio.run(run_collection(col, n_tasks))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        batch = col.prepare(state)
    keys = [(r.tree_id, r.edge_id, r.turn_index) for r in batch.actor]
    return {
        "fault_rate": fault_rate,
        "waves_in_flight": waves_in_flight,
        "client_timeout_s": timeout_s,
        "transitions": batch.stats["transitions"],
        "rollouts": batch.stats["rollouts"],
        "waves": len(state.waves),
        "failed_rollouts": batch.stats["failed_rollouts"],
        "failed_by_kind": {k: v for k, v in batch.stats.items() if k.startswith("failed_") and k != "failed_trees"},
        "failure_causes": batch.stats["failure_causes"],
        "failed_trees": batch.stats["failed_trees"],
        "requests": proxy.requests,
        "faults_injected": dict(sorted(proxy.injected.items())),
        "retries": dict(col.agent.policy.http.retries),
        "actor_rows": len(batch.actor),
        "duplicated_rows": len(keys) - len(set(keys)),
        "wall_s": round(wall, 2),
        # this process's CPU (the collection and the in-process fault proxy): unlike wall
        # time, it hardly moves with the machine's load
        "cpu_s": round(cpu, 2),
        "transitions_per_s": round(batch.stats["transitions"] / wall, 1),
        "state_pickle_bytes": len(pickle.dumps(state)),
        "memory": samples,
        "peak_rss": max(s["peak_rss"] for s in samples),
        "_batch": batch,
        "_rollout_walls": {(ti, r["rollout"]): r["wall_s"] for ti, t in enumerate(state.trees) for r in t.log},
    }


def compare(faulty: dict[str, Any], clean: dict[str, Any]) -> dict[str, Any]:
    """Rows lost and duplicated in the faulty batch relative to the clean one."""

    def key(r: Any) -> tuple[Any, ...]:
        return (r.tree_id, r.edge_id, r.turn_index, r.completion_ids, round(r.advantage, 9))

    got = [key(r) for r in faulty["_batch"].actor]
    want = [key(r) for r in clean["_batch"].actor]
    walls, base = faulty["_rollout_walls"], clean["_rollout_walls"]
    # rollouts a fault held up by a second or more (a hang past the client's timeout, or
    # several retries); smaller differences are the machine's noise as much as faults'
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


def growth(samples: list[dict[str, float]]) -> dict[str, float]:
    """Memory per transition over the second half of the run (least squares slope)."""
    tail = samples[len(samples) // 2 :]
    if len(tail) < 2:
        return {"bytes_per_transition": float("nan")}
    xs, ys = [s["transitions"] for s in tail], [s["rss"] for s in tail]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs) or 1.0
    return {"bytes_per_transition": sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var}


@contextlib.contextmanager
def server(kind: str, concurrency: int):
    if kind == "tinylm":
        from focus.backends import LocalModelServer

        with LocalModelServer(workers=2) as s:
            yield s.url
    else:
        from focus.testing.simserver import SimConfig, SimServerProcess

        with SimServerProcess(SimConfig(slots=concurrency, latency_s=0.01)) as s:
            yield s.url


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transitions", type=int, default=20_000)
    ap.add_argument("--fault-rate", type=float, default=0.1)
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--server", choices=["sim", "tinylm"], default="sim")
    ap.add_argument("--timeout-s", type=float, default=2.0, help="client read timeout (timeout faults hang 1.5x it)")
    ap.add_argument(
        "--waves-in-flight",
        type=int,
        default=SearchConfig().waves_in_flight,
        help="waves planned ahead (default: the pipeline's search.waves_in_flight); 1 = a barrier per wave",
    )
    ap.add_argument("--repeats", type=int, default=1, help="clean/faulty pairs (the median ratio's pair reported)")
    ap.add_argument(
        "--json", nargs="?", const="-", metavar="PATH", help="write the JSON report to PATH (alone: print it)"
    )
    ap.add_argument("--out", type=Path, help="also write the JSON report here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    with server(args.server, args.concurrency) as url:
        common = {
            "transitions": args.transitions,
            "n_tasks": args.tasks,
            "concurrency": args.concurrency,
            "timeout_s": args.timeout_s,
            "waves_in_flight": args.waves_in_flight,
        }
        pairs = []
        for _ in range(args.repeats):
            # clean then faulty, pair after pair: a change in the machine's load between
            # pairs moves both runs of a pair alike
            clean = run(url, fault_rate=0.0, **common)
            faulty = run(url, fault_rate=args.fault_rate, **common)
            pairs.append((compare(faulty, clean)["wall_ratio"], clean, faulty))
    pairs.sort(key=lambda p: p[0])
    _, clean, faulty = pairs[len(pairs) // 2]  # the pair with the median ratio
    report = {
        "command": "python -m benchmarks.load " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_before_after": [load_before, os.getloadavg()[0]],
        "benchmark_wall_s": round(time.perf_counter() - t0, 1),
        "server": args.server,
        "baseline": {k: v for k, v in clean.items() if not k.startswith("_") and k != "memory"},
        "faulty": {k: v for k, v in faulty.items() if not k.startswith("_") and k != "memory"},
        "memory_growth_faulty": growth(faulty["memory"]),
        "memory_growth_baseline": growth(clean["memory"]),
        "memory_samples_faulty": [
            {"transitions": s["transitions"], "rss_mib": round(s["rss"] / 2**20, 1)}
            for s in faulty["memory"][:: max(1, len(faulty["memory"]) // 10)]
        ],
        **compare(faulty, clean),
        "wall_ratio_repeats": [p[0] for p in pairs],
        "identical_batches_every_repeat": all(compare(f, c)["identical_batches"] for _, c, f in pairs),
    }
    if args.out:
        args.out.write_text(json.dumps(report, default=str, indent=2))
    if args.json and args.json != "-":
        Path(args.json).write_text(json.dumps(report, default=str, indent=2))
    elif args.json:
        print(json.dumps(report, default=str))
        return
    for k, v in report.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
