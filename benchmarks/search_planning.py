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
import json
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


def make(n_tasks: int, wave_size: int) -> tuple[Collector, list[Task]]:
    names = list(SHAPES)
    mdps = [SHAPES[names[i % len(names)]](i) for i in range(n_tasks)]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    phases = (
        Phase("evidence", rollouts_per_task=2),
        Phase("continue", transitions=10**9, wave_size=wave_size, max_branches=4, max_depth=8),
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
    search = col.search_config
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[40, 200, 1000])
    ap.add_argument("--waves", type=int, default=8, help="waves measured (after the warm-up waves)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--wave-size", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
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
