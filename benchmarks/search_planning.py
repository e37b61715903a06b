"""Per-wave search overhead (planning, grafting, scoring) against the collection size.

Builds a collection of ``--tasks`` synthetic tasks (``focus.synthetic``: the real Agent
code path over an in-process MDP, no server), runs the evidence phase, then
continuation waves of ``--wave-size`` jobs. For each wave it times, apart from the
rollouts themselves:

* ``plan``: ``plan_wave`` on the live state (what the collector does);
* ``graft``: ``graft`` of the wave's rollouts;
* ``score``: ``Collector.score`` of the grafted state (critic predictions are instant);
* ``plan_cold`` / ``graft_cold`` (baseline, same run): planning a state that has not
  been planned before (every tree ranked from scratch) and grafting after a full
  ``copy_state`` - the work every wave did before planning became incremental.

Medians over the measured waves, in milliseconds::

    .venv/bin/python -m benchmarks.search_planning [--tasks 40 200 1000] [--waves 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from focus.agent import Agent
from focus.collector import Collector
from focus.env import Task
from focus.execution import Execution
from focus.priority import Phase, Selective
from focus.search import SearchState, copy_state, graft, plan_wave
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, synthetic_format


def make(n_tasks: int, wave_size: int, transitions: int = 10**9, max_depth: int = 8) -> tuple[Collector, list[Task]]:
    names = list(SHAPES)
    mdps = [SHAPES[names[i % len(names)]](i) for i in range(n_tasks)]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    phases = (
        Phase("evidence", rollouts_per_task=2),
        # waves of --wave-size jobs: the cost per wave is measured at a given wave size
        Phase(
            "continue",
            transitions=transitions,
            wave_size=wave_size,
            max_branches=4,
            max_depth=max_depth,
            wave_unit="jobs",
        ),
    )
    col = Collector(
        agent,
        Selective(phases=phases),
        SyntheticCritic(mdps, 0.1),
        execution=Execution(max_concurrency=64),
        collection_id="bench",
        seed=0,
    )
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(n_tasks)]


def cold(state: SearchState) -> SearchState:
    """The same trees in a state that has never been planned (nothing derived yet)."""
    return SearchState(state.collection_id, state.seed, state.tasks, state.trees, list(state.waves))


async def measure(n_tasks: int, waves: int, warmup: int, wave_size: int) -> dict[str, Any]:
    col, tasks = make(n_tasks, wave_size)
    t0 = time.perf_counter()
    state = await col.run_evidence(tasks)
    setup_s = time.perf_counter() - t0
    search = col.priority
    times: dict[str, list[float]] = {k: [] for k in ("plan", "graft", "score", "rollouts", "plan_cold", "graft_cold")}
    for w in range(warmup + waves):
        c = time.perf_counter()
        plan_wave(cold(state), search, 1, w)
        plan_cold = time.perf_counter() - c
        a = time.perf_counter()
        plan = plan_wave(state, search, 1, w)
        b = time.perf_counter()
        rollouts = await col.execution.run(col.agent, list(plan.jobs))
        c = time.perf_counter()
        grafted = graft(state, plan, rollouts, "continue")
        d = time.perf_counter()
        new = await col.score(grafted)
        e = time.perf_counter()
        graft(copy_state(state), plan, rollouts, "continue")
        graft_cold = time.perf_counter() - e
        state = new
        if w >= warmup:
            for k, v in (
                ("plan", b - a),
                ("rollouts", c - b),
                ("graft", d - c),
                ("score", e - d),
                ("plan_cold", plan_cold),
                ("graft_cold", graft_cold),
            ):
                times[k].append(v)
    used = state.usage()
    return {
        "tasks": n_tasks,
        "transitions": used.transitions,
        "nodes": sum(len(t.nodes) for t in state.trees),
        "setup_s": round(setup_s, 2),
        **{f"{k}_ms": round(1000 * statistics.median(v), 2) for k, v in times.items()},
    }


def _quarters(waves: list[dict[str, Any]], total: int, key: str, scale: float = 1000.0) -> dict[str, float]:
    """Mean and median of ``key`` (times ``scale``: seconds to ms) over the waves that
    start in the first and in the last quarter of the continuation phase (by
    transitions collected before the wave)."""
    first = [w[key] for w in waves if w["before"] < total / 4]
    last = [w[key] for w in waves if w["before"] >= 3 * total / 4]
    out: dict[str, float] = {"waves_first": len(first), "waves_last": len(last)}
    for name, xs in (("first", first), ("last", last)):
        out[f"{name}_mean"] = round(scale * statistics.fmean(xs), 2) if xs else math.nan
        out[f"{name}_median"] = round(scale * statistics.median(xs), 2) if xs else math.nan
    out["ratio_mean"] = round(out["last_mean"] / out["first_mean"], 3) if first and last else math.nan
    out["ratio_median"] = round(out["last_median"] / out["first_median"], 3) if first and last else math.nan
    # per 1,000 transitions the waves collected: waves of different sizes compared fairly
    for name, ws in (
        ("first", [w for w in waves if w["before"] < total / 4]),
        ("last", [w for w in waves if w["before"] >= 3 * total / 4]),
    ):
        kt = sum(w["after"] - w["before"] for w in ws) / 1000
        out[f"{name}_per_kt"] = round(scale * sum(w[key] for w in ws) / kt, 2) if kt else math.nan
    out["ratio_per_kt"] = round(out["last_per_kt"] / out["first_per_kt"], 3) if first and last else math.nan
    return out


def plan_cost_over_collection(
    n_tasks: int = 40, transitions: int = 100_000, wave_size: int = 256, max_depth: int = 64
) -> dict[str, Any]:
    """Planning, grafting and scoring CPU per wave over one whole collection, and the
    last quarter against the first: whether the search's cost stays flat as the
    collection grows (goal: last/first <= 1.5 for planning at 100k transitions).

    The collector's own wave loop (plan, rollouts, graft, score), timed with
    ``time.process_time`` around each step; rollouts are the synthetic env and policy
    in process. The heap is frozen (``gc.freeze``) before each wave, as the pipeline
    keeps it: otherwise a full cyclic collection over every tree lands in whichever
    step happens to allocate at the time. Callable from other benchmarks
    (``benchmarks/scale.py``).
    """
    col, tasks = make(n_tasks, wave_size, transitions - 2 * 6 * n_tasks, max_depth)
    col = Collector(
        col.agent,
        col.priority,
        col.critic,
        execution=Execution(max_concurrency=64, freeze_gc=False),
        collection_id="bench",
        seed=0,
    )
    search = col.priority
    waves: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    async def collect() -> SearchState:
        # one event loop for the whole collection, as the collector runs it (an
        # asyncio.run per step would also time asyncio's set-up, which formats its
        # task's arguments - here the whole state - for a signal handler)
        state = await col.run_evidence(tasks)
        w = 0
        while True:
            before = state.usage().transitions if not waves else waves[-1]["after"]
            gc.freeze()
            c0 = time.process_time()
            plan = plan_wave(state, search, 1, w)
            c1 = time.process_time()
            if plan.empty:
                return state
            rollouts = await col.execution.run(col.agent, list(plan.jobs))
            c2 = time.process_time()
            grafted = graft(state, plan, rollouts, "continue")
            c3 = time.process_time()
            state = await col.score(grafted)
            c4 = time.process_time()
            after = before + sum(1 for ro in rollouts for t in ro.turns if t.transition)
            waves.append(
                {
                    "wave": w,
                    "before": before,
                    "after": after,
                    "jobs": len(plan.jobs),
                    "depth": statistics.fmean(state.trees[j.tree_index].nodes[j.node_id].depth for j in plan.jobs),
                    "plan": c1 - c0,
                    "rollouts": c2 - c1,
                    "graft": c3 - c2,
                    "score": c4 - c3,
                }
            )
            w += 1

    state = asyncio.run(collect())
    gc.unfreeze()
    # quarters of the continuation phase (the evidence wave alone may exceed a quarter)
    base = waves[0]["before"] if waves else 0
    for x in waves:
        x["before"], x["after"] = x["before"] - base, x["after"] - base
    total = waves[-1]["after"] if waves else 0
    return {
        "tasks": n_tasks,
        "transitions": total + base,
        "evidence_transitions": base,
        "waves": len(waves),
        "wave_size": wave_size,
        "max_depth": max_depth,
        "nodes": sum(len(t.nodes) for t in state.trees),
        "wall_s": round(time.perf_counter() - t0, 1),
        "calibrations_fitted_on_waves": sorted({k[0] for k in getattr(state, "_calibrations", {})}),
        "depth_of_continued_checkpoints": _quarters(waves, total, "depth", scale=1.0),
        "plan": _quarters(waves, total, "plan"),
        "graft": _quarters(waves, total, "graft"),
        "score": _quarters(waves, total, "score"),
        "per_wave": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in x.items()} for x in waves],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[40, 200, 1000])
    ap.add_argument("--waves", type=int, default=8, help="waves measured (after the warm-up waves)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--wave-size", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--max-depth", type=int, default=64, help="--scan: deepest checkpoint continued (Phase default)")
    ap.add_argument(
        "--scan",
        type=int,
        default=None,
        metavar="TRANSITIONS",
        help="instead: one collection of this many transitions per --tasks, cost per wave first vs last quarter",
    )
    args = ap.parse_args(argv)
    if args.scan:
        scans = [plan_cost_over_collection(n, args.scan, args.wave_size, args.max_depth) for n in args.tasks]
        for r in scans:
            print(json.dumps({k: v for k, v in r.items() if k != "per_wave"}))
        if args.json:
            args.json.write_text(json.dumps(scans, indent=1))
        return 0
    rows = [asyncio.run(measure(n, args.waves, args.warmup, args.wave_size)) for n in args.tasks]
    cols = list(rows[0])
    print(" ".join(f"{c:>12}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]!s:>12}" for c in cols))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
