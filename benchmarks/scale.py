"""FOCUS against the loop a user would write instead, from 2k to 100k transitions.

Both arms use the same Agent (``focus.toy.ReachTarget`` through ``OpenAICompatPolicy``
over HTTP, as in benchmarks/engine.py), the same tasks, the same concurrency and a fast
simulated model service (``focus.testing.simserver``: 256 slots at 5 ms per call by
default, capacity ~51,000 calls/s), so the collecting process, not the server, sets the
pace, and what is measured is each arm's own CPU:

* **focus**: ``Collector`` with the library's defaults - ``Selective`` priority over the
  default phase shape (an evidence phase of 4 rollouts per task, then a continuation
  phase, at most 4 branches per checkpoint, depth 8), ``DirectBranchTd``, the default
  ``Execution`` mode - then ``Collector.prepare``. The benchmark sets only the
  continuation budget (the size minus the evidence phase's expected transitions) and the
  wave size (= the concurrency, so a wave fills the executor as the baseline does).
* **baseline**: independent rollouts from each task's root under one ``asyncio.gather``
  bounded by a semaphore of the same concurrency, ``k`` per task with ``k`` chosen so the
  expected transitions cover the size; then GRPO advantages
  (``focus.estimation.GroupNormalized`` over each task's group) and actor rows in a
  ``focus.batch.BatchBuilder`` (the same product a trainer reads).
* **tuned**: the same loop with its garbage collector tuned as a careful user would:
  ``gc.disable()`` from before the first env reset until the batch is built (no cyclic
  collection in between; the default GC's cost is the baseline's largest excess).

Rows: every size with few tasks (``--few-tasks``, 40) and with many
(``--tasks-per-1k`` per 1,000 transitions, 20), once where the two coincide. Each arm of
each row runs in a fresh process with its own server process, so peak RSS is that arm's
and the server's CPU is not counted; the arms of a row run one after another, each
first in turn over the repeats. Per arm:

* ``transitions_per_s`` (from the first env reset to the built batch);
* ``cpu_ms_per_transition`` (this process: ``time.process_time``), split into
  ``search`` (planning, grafting and scoring: the thread CPU inside the public functions
  of ``focus.search`` wherever the collector's modules call them - ``plan_*`` is
  planning, ``graft`` grafting, ``unscored``/``with_predictions`` scoring, and
  ``prefit``, what a refit's calibration reads of each tree, computed in the wave's
  tail), ``prepare`` (advantages and batch) and ``rollout`` (the rest: env resets, the agent,
  HTTP, the event loop); apart from that split, ``gc_cpu_ms_per_transition`` is the
  CPU inside Python's cyclic garbage collector wherever it ran (the baseline runs with
  the default GC, as a user's loop would; ``Execution`` keeps the trees out of it while
  a wave runs), and the JSON also compares the arms without it;
* ``peak_rss_mib`` and the growth over the RSS before collecting, per transition
  (``rss_growth_kib_per_transition``; FOCUS / baseline is the memory goal's figure);
* ``idle_share``: the share of the collection (first model call to last answer) with
  no model call in flight from the arm (:class:`CallMeter`): the wave barriers, the
  server's idle time that the collection's schedule causes (each barrier's start and
  length in ``idle_gaps_ms``, largest first). Beside it, from the
  server's request log (:func:`server_occupancy`), ``server_idle_share`` (no request
  in the server) and ``server_underfilled_share`` (fewer than half the slots in
  service); those also count the time answers wait for a busy client, so they grow
  with the machine's load and with the client's own CPU, in both arms;
* where the wall time that is not CPU goes (:class:`WallMeter`, the event loop's
  thread): ``runqueue_s`` (runnable, waiting for a CPU: the machine's other load and
  the server process), ``loop_wait_calls_s`` (asleep in the selector with calls in
  flight: waiting on answers), ``loop_wait_idle_s`` (with none: a barrier's planning
  thread), ``other_wait_s`` (the GIL and the rest), beside ``main_thread_cpu_s``;
* focus only: every continuation wave's plan/graft/score CPU in order, and mean plan CPU
  per wave in the first and last quarter of the waves.

The JSON holds every figure and the ratios the goals below name: focus / baseline CPU per
transition at every row; focus / baseline and focus / tuned transitions per second at
every row (at least 1.0: ``THROUGHPUT_GOALS``), with focus / tuned CPU per transition
beside them; focus CPU per transition at each size / at the smallest size of the same
task series; plan CPU per wave, last quarter / first quarter, at the largest size;
focus / baseline RSS growth per transition at the largest size; focus's idle share at
every row.

    python -m benchmarks.scale [--json PATH] [--quick] [--sizes 2000 10000 ...] [--repeats 3]

Rows up to ``--repeat-max-size`` (40k) run ``--repeats`` times, the repeats going round
the rows, and each arm reports its median run: a short row is where a burst of load
from elsewhere moves CPU per transition most.

``--quick`` runs tiny sizes against a small server in seconds (used by
tests/test_bench_scale.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.results import ROOT, git_commit, load_average, machine

# The arms, meters and summary live in their own modules (one role each); their names
# stay importable from here, where tests and the other benchmarks read them.
from benchmarks.scale_arms import (  # noqa: F401 (re-exported)
    ARMS,
    CRITIC_VALUE,
    SEED,
    TARGETS,
    baseline_group_size,
    expected_rollout_transitions,
    expected_task_transitions,
    focus_search,
    run_arm,
    run_baseline,
    run_focus,
    run_tuned,
    warm_up,
)
from benchmarks.scale_meters import (  # noqa: F401 (re-exported)
    GAP_LISTED_S,
    UNDERFILLED,
    CallMeter,
    GcMeter,
    SearchMeter,
    WallMeter,
    server_occupancy,
)
from benchmarks.scale_summary import (  # noqa: F401 (re-exported)
    GOALS,
    THROUGHPUT_GOALS,
    arms_table,
    memory_idle_table,
    size_label,
    summarise,
    summarise_memory_and_idle,
    table,
    with_tuned_arm,
)

# -- the run ---------------------------------------------------------------------------


def rows_for(sizes: Sequence[int], few: int, per_1k: float) -> list[tuple[int, int, str]]:
    """(size, tasks, series) for every size with few and many tasks, once where equal."""
    rows = []
    for n in sizes:
        many = max(1, round(per_1k * n / 1000))
        rows.append((n, few, "few"))
        if many != few:
            rows.append((n, many, "many"))
    return rows


def run_child(cfg: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """``run_arm`` in a fresh interpreter (own peak RSS, own GC history)."""
    with tempfile.TemporaryDirectory(prefix="focus-scale-") as tmp:
        out = Path(tmp) / "arm.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "benchmarks.scale", "--child", json.dumps(cfg), "--child-out", str(out)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout_s)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{cfg['arm']} arm failed (exit {proc.returncode}): {' '.join(cmd)}")
        return dict(json.loads(out.read_text()))


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median CPU per transition (the lower middle of an even count),
    whole, so every figure reported for a row comes from one run."""
    ordered = sorted(runs, key=lambda r: r["cpu_ms_per_transition"])
    return ordered[(len(ordered) - 1) // 2]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; ``--quick`` swaps in tiny sizes and a small server."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--quick", action="store_true", help="tiny sizes against a small server, seconds")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 10000, 40000, 100000])
    ap.add_argument("--few-tasks", type=int, default=40)
    ap.add_argument("--tasks-per-1k", type=float, default=20.0, help="tasks per 1,000 transitions, many-task rows")
    ap.add_argument("--slots", type=int, default=256)
    ap.add_argument("--latency-ms", type=float, default=5.0, help="time a call holds its slot")
    ap.add_argument("--tokens", type=int, default=3, help="tokens generated per call")
    ap.add_argument("--concurrency", type=int, default=512, help="rollouts in flight (both arms); FOCUS wave size")
    ap.add_argument("--timeout-s", type=float, default=3600.0, help="per arm")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each row up to --repeat-max-size; median run kept")
    ap.add_argument("--repeat-max-size", type=int, default=40000, help="larger rows run once")
    ap.add_argument(
        "--depth-share",
        type=float,
        help="FOCUS's Selective.depth_share (default: the library's); for a comparison, not the record",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.depth_share is not None and not args.depth_share >= 0:
        ap.error(f"--depth-share must be 0 or more, got {args.depth_share}")
    if args.quick and not args.child:
        args.sizes, args.few_tasks, args.tasks_per_1k = [300, 1000], 6, 20.0
        args.slots, args.latency_ms, args.concurrency = 16, 2.0, 32
        args.repeats, args.repeat_max_size = min(args.repeats, 2), 300
    return args


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings, as the JSON's ``config`` records them."""
    return {
        "sizes": args.sizes,
        "few_tasks": args.few_tasks,
        "tasks_per_1k": args.tasks_per_1k,
        "slots": args.slots,
        "latency_ms": args.latency_ms,
        "completion_tokens": args.tokens,
        "concurrency": args.concurrency,
        "task_targets": list(TARGETS),
        "critic": f"ConstantCritic({CRITIC_VALUE})",
        "repeats": args.repeats,
        "repeat_max_size": args.repeat_max_size,
        "depth_share": args.depth_share,
    }


def child_config(args: argparse.Namespace, arm: str, n: int, tasks: int) -> dict[str, Any]:
    """What one arm of one row is told (the ``--child`` JSON)."""
    return {
        "arm": arm,
        "transitions": n,
        "tasks": tasks,
        "slots": args.slots,
        "latency_s": args.latency_ms / 1000,
        "completion_tokens": args.tokens,
        "concurrency": args.concurrency,
        "depth_share": args.depth_share,
    }


def progress_line(key: str, rep: int, runs: dict[str, list[dict[str, Any]]], load: Any) -> str:
    """The latest run of each arm of one row, for stderr as the rows go."""
    f, b, u = runs["focus"][-1], runs["baseline"][-1], runs["tuned"][-1]
    return (
        f"{key} (run {rep + 1}): focus {f['transitions']} t, {f['transitions_per_s']:.0f} t/s, "
        f"{f['cpu_ms_per_transition']:.3f} ms/t; baseline {b['transitions']} t, "
        f"{b['transitions_per_s']:.0f} t/s, {b['cpu_ms_per_transition']:.3f} ms/t; tuned "
        f"{u['transitions_per_s']:.0f} t/s, {u['cpu_ms_per_transition']:.3f} ms/t; "
        f"load {load}"
    )


def run_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every row of the plan, each arm in its own child process; per row and arm, the
    median run and the CPU per transition of every run."""
    plan = rows_for(args.sizes, args.few_tasks, args.tasks_per_1k)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    rows: dict[str, dict[str, Any]] = {}
    # Repeats go round the rows (a burst of load hits one run of a row, not all of
    # them); rows above --repeat-max-size run once.
    for rep in range(args.repeats):
        for n, tasks, series in plan:
            if rep > 0 and n > args.repeat_max_size:
                continue
            key = f"{size_label(n)}_{tasks}t"
            row = rows.setdefault(
                key,
                {
                    "key": key,
                    "series": series,
                    "transitions_budget": n,
                    "tasks": tasks,
                    "load_average_before": load_average(),
                },
            )
            for arm in list(ARMS)[rep % len(ARMS) :] + list(ARMS)[: rep % len(ARMS)]:  # each first in turn
                cfg = child_config(args, arm, n, tasks)
                runs.setdefault(key, {}).setdefault(arm, []).append(run_child(cfg, args.timeout_s))
            row["load_average_after"] = load_average()
            print(progress_line(key, rep, runs[key], row["load_average_after"]), file=sys.stderr, flush=True)
    for key, row in rows.items():
        for arm, done in runs[key].items():
            row[arm] = median_run(done)
            row[f"{arm}_cpu_ms_per_transition_each_run"] = [r["cpu_ms_per_transition"] for r in done]
    return list(rows.values())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.child:
        out = run_arm(json.loads(args.child))
        args.child_out.write_text(json.dumps(out))
        return out
    t0 = time.perf_counter()
    figures: dict[str, Any] = {
        "machine": machine(),
        "git_commit": git_commit(),
        "command": " ".join(["python -m benchmarks.scale", *(argv if argv is not None else sys.argv[1:])]),
        "load_average_at_start": load_average(),
        "config": run_config(args),
    }
    rows = run_rows(args)
    figures["rows"] = rows
    figures.update(summarise(rows))
    figures["benchmark_wall_s"] = time.perf_counter() - t0
    figures["load_average_at_end"] = load_average()
    print(table(rows))
    print(memory_idle_table(rows))
    print(arms_table(rows))
    print(json.dumps({"ratios": figures["ratios"], "goals": figures["goals"]}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
