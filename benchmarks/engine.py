"""Engine throughput: does collection keep a model service's slots busy, cheaply?

The model service is ``focus/testing/simserver.py`` in its own process: a real HTTP server
speaking the OpenAI-compatible completions subset, with a fixed number of serving
slots, a fixed latency per call (plus per generated token) and a prefix cache. The
engine is the real one: ``focus.Collector`` with ``Selective`` search (an evidence
phase and a continuation phase in waves), ``focus.toy.ReachTarget`` (several steps per
episode, a checkpoint at every decision), ``OpenAICompatPolicy`` over HTTP, and
``Execution`` in-process or ``DaskExecution`` on 1 and 2 workers.

Figures, all from one run:

* ``slot_utilisation``: busy slot-seconds / (slots x wall time of the search). The
  in-process run is done three times: in the pipeline's mode (waves planned ahead,
  ``Selective(waves_in_flight=2)``, the pipeline's default ``search.waves_in_flight``:
  deterministic and resumable per wave), in plain wave mode (``waves_in_flight=1``: a
  barrier after every wave) and in streaming mode (``Execution(streaming=True)``:
  continuation phases keep ``max_concurrency`` rollouts in flight, no waves, not
  resumable part-way); their figures are under ``pipeline_mode``, ``wave_mode`` and
  ``streaming_mode``, and the headline figures (top level) are the pipeline mode's.
  ``slot_utilisation_continuation`` is the same over the continuation phase only (the
  evidence wave drains the server in every mode).
* ``transitions_per_s`` against ``ideal_transitions_per_s`` = slots / call latency.
* ``engine_cpu_ms_per_transition``: CPU time of this (collecting) process during the
  search / transitions; the server's CPU is in another process and not counted.
* ``prefix_cache_hit_ratio``: over the first model call of every continuation (the call
  that resends a checkpoint's prefix), prompt tokens the server found in its prefix
  cache / prompt tokens. The calls are found in the server's request log by their seed
  (the agent seeds a rollout's first call with the rollout's seed; siblings sent as one
  request are logged one row per sample, sample ``j`` under ``seed + j``: its own).
* ``scaling_1_to_2_workers``: transitions/s with ``DaskExecution(n_workers=2)`` over
  ``n_workers=1``, against a server with slots to spare and a short latency, so the
  workers rather than the server limit throughput. In the headline run every env step
  also costs ``--scale-env-cpu-ms`` of CPU (``CpuBoundReachTarget``), as real agent envs
  do (tools, tests, parsers): that is the work scaling out is for, and on a machine with
  few cores it is the only case where the workers, not the server and scheduler sharing
  their cores, set the pace. ``scaling_1_to_2_workers_toy_env`` repeats the run with
  the plain toy env, where the engine's own ~0.7 ms per transition is the workers' only
  work and the server's CPU per call is of the same order.

    .venv/bin/python -m benchmarks.engine [--json out.json] [--small] [--profile] [--no-streaming] [--no-dask]
        [--waves-in-flight N] [--repeats N]

``--small`` runs a tiny configuration in seconds, Dask workers as threads (used by
tests/test_simserver.py; its scaling figure means nothing).
``--profile`` prints a pyinstrument profile of the in-process search.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import PrivateAttr

from focus.agent import Agent
from focus.backends.http import HttpConfig
from focus.backends.openai_compat import OpenAICompatPolicy
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import SamplingParams
from focus.priority import Phase, Selective
from focus.search import SearchState
from focus.testing.simserver import SimConfig, SimServerProcess
from focus.toy import ReachTarget, reach_target_tasks, toy_format
from tasks.config import SearchConfig

GOALS = {
    "slot_utilisation": 0.90,
    "engine_cpu_ms_per_transition": 1.0,
    "prefix_cache_hit_ratio": 0.95,
    "scaling_1_to_2_workers": 1.7,
}


class CpuBoundReachTarget(ReachTarget):
    """``ReachTarget`` whose every step first burns ``cpu_ms`` of CPU, as an env that runs
    a tool, a test or a parser does. The result of each step is unchanged."""

    def __init__(self, cpu_ms: float, max_turns: int = 32) -> None:
        super().__init__(max_turns)
        self.cpu_ms = cpu_ms

    async def step(self, state: Any, action: Any, workspace: Any) -> Any:
        end = time.thread_time() + self.cpu_ms / 1000
        x = 0
        while time.thread_time() < end:
            x = (x * 1103515245 + 12345) % 2**31
        return await super().step(state, action, workspace)


def make_agent(url: str, concurrency: int, env_cpu_ms: float = 0.0) -> Agent:
    policy = OpenAICompatPolicy(
        url,
        config=HttpConfig(max_concurrency=concurrency, timeout_s=120.0),
        vocab_size=ByteCodec.vocab_size,
    )
    env = CpuBoundReachTarget(env_cpu_ms) if env_cpu_ms else ReachTarget()
    return Agent(policy, env, toy_format(), max_steps=16, sampling=SamplingParams(max_tokens=8))


def make_collector(
    agent: Agent, execution: Execution, *, transitions: int, wave_size: int, seed: int, waves_in_flight: int = 1
) -> Collector:
    search = Selective(
        phases=(
            Phase("evidence", rollouts_per_task=2),
            Phase("continue", transitions=transitions, wave_size=wave_size, max_branches=4, max_depth=8),
        ),
        waves_in_flight=waves_in_flight,
    )
    return Collector(
        agent, search=search, critic=ConstantCritic(0.5), execution=execution, collection_id="bench", seed=seed
    )


class MeasuredExecution(Execution):
    """The in-process execution service, also summing this process's CPU time inside
    ``run`` (rollouts only), so the rest of the search (planning, grafting, scoring)
    can be told apart from the rollouts. No other behaviour changes. In streaming mode
    only the evidence wave goes through ``run``."""

    supports_streaming = True
    _cpu_s: float = PrivateAttr(0.0)
    _wall_s: float = PrivateAttr(0.0)

    async def run(self, agent: Agent, jobs: list[Any]) -> list[Any]:
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            return await super().run(agent, jobs)
        finally:
            self._cpu_s += time.process_time() - c0
            self._wall_s += time.perf_counter() - t0


def continuation_cache_ratio(state: SearchState, rows: list[list[Any]]) -> dict[str, Any]:
    """Cache hits of the first call of every continuation, found in the server log by seed."""
    by_seed = {r[3]: r for r in rows}
    prompt = cached = calls = missing = 0
    for tree in state.trees:
        for rec in tree.log:
            if rec.phase_name == "evidence" or rec.node == tree.ROOT:
                continue
            row = by_seed.get(rec.seed)
            if row is None:
                missing += 1
                continue
            calls += 1
            prompt += row[4]
            cached += row[5]
    total_prompt = sum(r[4] for r in rows)
    return {
        "prefix_cache_hit_ratio": cached / prompt if prompt else float("nan"),
        "continuation_first_calls": calls,
        "continuation_calls_not_found": missing,
        "all_calls_cache_hit_ratio": sum(r[5] for r in rows) / total_prompt if total_prompt else float("nan"),
    }


class MarkedCollector(Collector):
    """A collector that notes the time and the server's totals when the evidence phase
    ends, so the continuation phase can be measured on its own."""

    def __init__(self, *args: Any, server: SimServerProcess, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.server = server
        self.mark: tuple[float, dict[str, Any]] | None = None

    async def run_evidence(self, tasks: Any, journal: Any = None) -> SearchState:
        state = await super().run_evidence(tasks, journal)
        self.mark = (time.perf_counter(), self.server.stats())
        return state


def _search(collector: Collector, tasks: list[Any]) -> SearchState:
    """``search`` on a fresh loop. The state leaves through a holder, not as the main
    task's result: Python 3.11's ``asyncio.run`` formats the repr of its main task (result
    included) on exit, which for a large state costs about a second of CPU."""
    out: list[SearchState] = []

    async def go() -> None:
        try:
            out.append(await collector.search(tasks))
        finally:
            await collector.agent.policy.aclose()

    asyncio.run(go())
    return out[0]


def run_in_process(args: argparse.Namespace, *, mode: str, seed: int = 0) -> dict[str, Any]:
    """Utilisation, CPU per transition and prefix-cache hits at ``args.slots`` slots, in
    ``mode``: ``pipeline`` (waves planned ahead), ``waves`` (one at a time), ``streaming``;
    ``seed``: the collection's (which rollouts the draw gives, hence the wave tails)."""
    streaming = mode == "streaming"
    ahead = args.waves_in_flight if mode == "pipeline" else 1
    sim = SimConfig(
        slots=args.slots, latency_s=args.latency_s, per_token_s=args.per_token_s, completion_tokens=args.tokens
    )
    latency = sim.latency_s + sim.per_token_s * sim.completion_tokens
    # More rollouts than slots keeps a queue at the server: a slot freed while the engine
    # is busy elsewhere (between calls, in GC) is refilled from the queue at once.
    concurrency = args.rollouts_per_slot * args.slots
    tasks = reach_target_tasks(args.tasks, seed=1, low=20, high=40)
    with SimServerProcess(sim) as server:
        agent = make_agent(server.url, concurrency)
        execution = MeasuredExecution(max_concurrency=concurrency, streaming=streaming)
        base = make_collector(
            agent, execution, transitions=args.transitions, wave_size=args.wave_size, seed=seed, waves_in_flight=ahead
        )
        collector = MarkedCollector(
            agent,
            base.priority,
            base.critic,
            execution=execution,
            collection_id=base.collection_id,
            seed=base.seed,
            server=server,
        )
        before = server.stats()
        with _profiled(args.profile):
            c0, t0 = time.process_time(), time.perf_counter()
            state = _search(collector, tasks)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        after = server.stats()
        c1 = time.process_time()
        batch = collector.prepare(state)
        prepare_cpu = time.process_time() - c1
        rows = server.requests()
    usage = state.usage()
    transitions = usage.transitions
    busy = after["busy_slot_s"] - before["busy_slot_s"]
    assert collector.mark is not None
    t_mark, at_mark = collector.mark
    cont_wall = t0 + wall - t_mark
    out = {
        "mode": mode,
        "collection_seed": seed,
        "waves_in_flight": ahead,
        "slots": args.slots,
        "call_latency_s": latency,
        "tasks": args.tasks,
        "wave_size": args.wave_size,
        "execution_concurrency": concurrency,
        "transitions": transitions,
        "model_calls": usage.model_calls,
        "rollouts": usage.rollouts,
        "failed_rollouts": usage.failed_rollouts,
        "waves": len(state.waves),
        "search_wall_s": wall,
        "transitions_per_s": transitions / wall,
        "ideal_transitions_per_s": args.slots / latency,
        "slot_utilisation": busy / (args.slots * wall),
        "slot_utilisation_continuation": (after["busy_slot_s"] - at_mark["busy_slot_s"]) / (args.slots * cont_wall),
        "continuation_wall_s": cont_wall,
        "server_max_waiting": after["max_waiting"],
        "engine_cpu_s": cpu,
        "engine_cpu_ms_per_transition": 1000 * cpu / transitions,
        "server_cpu_ms_per_request": 1000
        * (after["cpu_s"] - before["cpu_s"])
        / max(1, after["requests"] - before["requests"]),
        "prepare_cpu_ms_per_transition": 1000 * prepare_cpu / transitions,
        "actor_rows": len(batch.actor),
        **continuation_cache_ratio(state, rows),
    }
    out["throughput_vs_ideal"] = out["transitions_per_s"] / out["ideal_transitions_per_s"]
    if mode == "waves":
        out.update(_wave_split(execution, busy / args.slots, wall, cpu, transitions))
    return out


def _wave_split(
    execution: MeasuredExecution, busy_per_slot: float, wall: float, cpu: float, transitions: int
) -> dict[str, float]:
    """Plain wave mode's split of the search: only there does every rollout run inside
    one ``Execution.run`` at a time, so only there can the rollouts' CPU and wall time
    be told apart from planning, grafting and scoring between waves."""
    return {
        # the same while waves run; the rest is planning, grafting and scoring between waves
        "slot_utilisation_within_waves": busy_per_slot / execution._wall_s,
        "between_waves_s": wall - execution._wall_s,
        "rollout_cpu_ms_per_transition": 1000 * execution._cpu_s / transitions,
        "search_overhead_cpu_ms_per_transition": 1000 * (cpu - execution._cpu_s) / transitions,
    }


@contextlib.contextmanager
def _profiled(enabled: bool) -> Iterator[None]:
    """A pyinstrument profile of the block, printed to stderr (``--profile``)."""
    if not enabled:
        yield
        return
    import pyinstrument

    profiler = pyinstrument.Profiler()
    profiler.start()
    try:
        yield
    finally:
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False), file=sys.stderr)


def run_modes(args: argparse.Namespace) -> dict[str, Any]:
    """Every mode on the same server settings, ``--repeats`` times, interleaved (so a
    change in the machine's load hits every mode alike); each mode reports its run with
    the median utilisation, and every run's utilisation. Repeat ``r`` collects with seed
    ``r``: a collection is deterministic, and its draw decides how long its waves' tails
    are (seeds 0-2 at 54751fd: 0.872, 0.926, 0.928 in the pipeline mode), so the
    repeats are draws, not reruns of one. The headline figures are the pipeline mode's."""
    names = {"pipeline": "pipeline_mode", "waves": "wave_mode"}
    if not args.no_streaming:
        names["streaming"] = "streaming_mode"
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in names}
    for rep in range(args.repeats):
        for mode in names:
            runs[mode].append(run_in_process(args, mode=mode, seed=rep))
    modes = {}
    for mode, key in names.items():
        done = sorted(runs[mode], key=lambda r: r["slot_utilisation"])
        modes[key] = {
            **done[len(done) // 2],
            "slot_utilisation_repeats": [round(r["slot_utilisation"], 4) for r in runs[mode]],
        }
    return {**modes["pipeline_mode"], "headline_mode": "pipeline", **modes}


def run_dask(args: argparse.Namespace, env_cpu_ms: float, suffix: str) -> dict[str, Any]:
    """Transitions/s on 1 and 2 Dask workers, with the server far from saturated; every
    env step costs ``env_cpu_ms`` of CPU on the worker. Figures keyed ``...<suffix>``."""
    from focus.dask_execution import DaskExecution

    # Slots to spare and no prefix cache (the trie is most of the server's CPU): the
    # server, which shares the machine's cores with the workers, should limit as little
    # as it can.
    sim = SimConfig(
        slots=100_000, latency_s=args.scale_latency_s, completion_tokens=args.tokens, cache_capacity_tokens=0
    )
    tasks = reach_target_tasks(args.scale_tasks, seed=2, low=20, high=40)
    out: dict[str, Any] = {
        "scale_call_latency_s": sim.latency_s,
        "scale_tasks": args.scale_tasks,
        "dask_worker_processes": args.dask_processes,
        f"scale_env_cpu_ms{suffix}": env_cpu_ms,
    }
    with SimServerProcess(sim) as server:
        for workers in (1, 2):
            with DaskExecution(
                n_workers=workers,
                threads_per_worker=1,
                processes=args.dask_processes,
                max_concurrency=args.scale_concurrency,
            ) as ex:
                ex.client().wait_for_workers(workers)
                warm = make_collector(
                    make_agent(server.url, args.scale_concurrency, env_cpu_ms), ex, transitions=16, wave_size=8, seed=99
                )
                _search(warm, reach_target_tasks(4, seed=3, low=20, high=40))  # imports on the workers
                collector = make_collector(
                    make_agent(server.url, args.scale_concurrency, env_cpu_ms),
                    ex,
                    transitions=args.scale_transitions,
                    wave_size=args.scale_wave_size,
                    seed=0,
                )
                before = server.stats()
                t0 = time.perf_counter()
                state = _search(collector, tasks)
                wall = time.perf_counter() - t0
                after = server.stats()
            n = state.usage().transitions
            out[f"dask_{workers}_workers{suffix}"] = {
                "transitions": n,
                "wall_s": wall,
                "transitions_per_s": n / wall,
                "server_cpu_share": (after["cpu_s"] - before["cpu_s"]) / wall,
                "server_max_in_flight": after["max_in_flight"],
                "server_busy_slot_s": after["busy_slot_s"] - before["busy_slot_s"],
            }
    out[f"scaling_1_to_2_workers{suffix}"] = (
        out[f"dask_2_workers{suffix}"]["transitions_per_s"] / out[f"dask_1_workers{suffix}"]["transitions_per_s"]
    )
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--small", action="store_true", help="tiny sizes, seconds (a smoke run)")
    ap.add_argument("--profile", action="store_true", help="pyinstrument profile of the in-process search")
    ap.add_argument("--no-dask", action="store_true", help="skip the 1 -> 2 worker scaling run")
    ap.add_argument("--no-streaming", action="store_true", help="skip the streaming-mode run")
    ap.add_argument("--repeats", type=int, default=1, help="in-process runs per mode (median reported)")
    ap.add_argument(
        "--waves-in-flight",
        type=int,
        default=SearchConfig().waves_in_flight,
        help="waves planned ahead in the pipeline mode (default: the pipeline's search.waves_in_flight)",
    )
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--latency-s", type=float, default=0.2)
    ap.add_argument("--per-token-s", type=float, default=0.01)
    ap.add_argument("--tokens", type=int, default=3, help="tokens generated per call")
    ap.add_argument("--rollouts-per-slot", type=int, default=4, help="in-process execution concurrency / slots")
    ap.add_argument("--tasks", type=int, default=256)
    ap.add_argument("--transitions", type=int, default=12000, help="continuation phase budget")
    ap.add_argument("--wave-size", type=int, default=4096)
    ap.add_argument("--scale-tasks", type=int, default=256)
    ap.add_argument("--scale-transitions", type=int, default=6000)
    ap.add_argument("--scale-wave-size", type=int, default=4096)
    ap.add_argument("--scale-latency-s", type=float, default=0.05)
    ap.add_argument("--scale-concurrency", type=int, default=256)
    ap.add_argument(
        "--scale-env-cpu-ms",
        type=float,
        default=5.0,
        help="CPU per env step in the headline scaling run (the toy env's own run follows)",
    )
    ap.add_argument(
        "--dask-threads", dest="dask_processes", action="store_false", help="Dask workers as threads (smoke runs)"
    )
    args = ap.parse_args(argv)
    if args.small:
        args.slots, args.tasks, args.transitions, args.wave_size = 8, 8, 40, 16
        args.latency_s, args.per_token_s = 0.01, 0.0
        args.scale_tasks, args.scale_transitions, args.scale_wave_size, args.scale_latency_s = 8, 40, 16, 0.01
        args.scale_concurrency, args.dask_processes = 16, False
    logging.getLogger("distributed").setLevel(logging.ERROR)
    t0 = time.perf_counter()
    figures: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_at_start": os.getloadavg()[0],
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    figures.update(run_modes(args))
    if not args.no_dask:
        figures.update(run_dask(args, args.scale_env_cpu_ms, ""))
        figures.update(run_dask(args, 0.0, "_toy_env"))
    figures["benchmark_wall_s"] = time.perf_counter() - t0
    figures["load_average_at_end"] = os.getloadavg()[0]
    figures["goals"] = {
        k: {"goal": g, "met": (figures[k] >= g) if k != "engine_cpu_ms_per_transition" else figures[k] <= g}
        for k, g in GOALS.items()
        if k in figures
    }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return figures


if __name__ == "__main__":
    main()
