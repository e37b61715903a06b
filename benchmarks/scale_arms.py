"""The arms of benchmarks/scale.py: FOCUS, the loop a user would write, and that loop
with its GC off, each collecting one row's budget against a simulated server.

:func:`run_arm` is one arm of one row in the current process (benchmarks/scale.py runs
it in a fresh one per arm; benchmarks/scale_inproc.py calls the arms in process), with
the sizing that gives every arm the same expected transitions.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from benchmarks.engine import make_agent
from benchmarks.scale_meters import (
    CallMeter,
    GcMeter,
    SearchMeter,
    WallMeter,
    peak_rss_mib,
    rss_now_mib,
    server_occupancy,
)
from focus.agent import Agent, Rollout, derive_seed
from focus.batch import Batch, BatchBuilder
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.env import Task
from focus.estimation import GroupNormalized
from focus.execution import Execution
from focus.priority import Selective
from focus.testing.simserver import DIGITS, SimConfig, SimServerProcess
from focus.toy import reach_target_tasks
from focus.tree import Tree

TARGETS = (20, 40)  # ReachTarget targets, as in benchmarks/engine.py
CRITIC_VALUE = 0.5  # a constant critic in the middle of the reward range
SEED = 0


# -- sizing ----------------------------------------------------------------------------


@functools.cache
def expected_rollout_transitions(target: int, max_steps: int) -> float:
    """Expected transitions of a rollout from the root of a ReachTarget task: the
    simulated server's first token is a uniform digit 1-9, the parser takes it, the
    episode ends once the total reaches ``target`` or after ``max_steps`` calls."""
    n = len(DIGITS)  # the digits 1..n, equally likely
    left = [0.0] * (target + 1)  # expected calls by distance to the target, with s steps left
    for _ in range(max_steps):
        left = [0.0] + [1.0 + sum(left[max(r - d, 0)] for d in range(1, n + 1)) / n for r in range(1, target + 1)]
    return left[target]


def expected_task_transitions(tasks: Sequence[Task], max_steps: int) -> float:
    """Expected transitions of one rollout from every task's root, summed."""
    return sum(expected_rollout_transitions(int(t.data["target"]), max_steps) for t in tasks)


def focus_search(transitions: int, tasks: Sequence[Task], max_steps: int, wave_size: int) -> Selective:
    """The library's default ``Selective`` phases, with the continuation budget set so
    that evidence + continuation come to ``transitions`` (in expectation) and waves of
    ``wave_size`` jobs."""
    evidence, cont = Selective().phases
    assert evidence.rollouts_per_task is not None
    expected_evidence = evidence.rollouts_per_task * expected_task_transitions(tasks, max_steps)
    budget = int(round(transitions - expected_evidence))
    if budget < 0.1 * transitions:
        raise ValueError(
            f"{len(tasks)} tasks spend ~{expected_evidence:.0f} transitions in the evidence phase: "
            f"too many for a collection of {transitions}"
        )
    return Selective(phases=(evidence, cont.model_copy(update={"transitions": budget, "wave_size": wave_size})))


def baseline_group_size(transitions: int, tasks: Sequence[Task], max_steps: int) -> int:
    """Rollouts per task so that the expected transitions cover ``transitions``."""
    return max(1, math.ceil(transitions / expected_task_transitions(tasks, max_steps)))


def _run(make: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine on a fresh loop; the result leaves through a holder, not as the
    main task's result (Python 3.11's ``asyncio.run`` formats that repr on exit, about a
    second of CPU for a large state)."""
    out: list[Any] = []

    async def go() -> None:
        out.append(await make())

    asyncio.run(go())
    return out[0]


# -- the two arms ----------------------------------------------------------------------


def arm_search(cfg: dict[str, Any], tasks: Sequence[Task], max_steps: int) -> Selective:
    """The FOCUS arm's search: :func:`focus_search`, with ``depth_share`` where the run
    sets one (``--depth-share``: a comparison, not the library's default)."""
    search = focus_search(cfg["transitions"], tasks, max_steps, cfg["concurrency"])
    if cfg.get("depth_share") is not None:
        search = search.model_copy(update={"depth_share": float(cfg["depth_share"])})
    return search


def run_focus(agent: Agent, tasks: list[Task], cfg: dict[str, Any]) -> tuple[dict[str, Any], Batch]:
    search = arm_search(cfg, tasks, agent.max_steps)
    collector = Collector(
        agent,
        search,
        ConstantCritic(CRITIC_VALUE),
        execution=Execution(max_concurrency=cfg["concurrency"]),  # the default Execution mode
        collection_id="scale",
        seed=SEED,
    )
    meter = SearchMeter(search).install()

    async def search_all() -> Any:
        try:
            return await collector.search(tasks)
        finally:
            await agent.policy.aclose()

    try:
        state = _run(search_all)
        batch = meter.measure("prepare", collector.prepare, state)
    finally:
        meter.uninstall()
    # the usage prepare put in the batch's statistics: three more passes over every
    # rollout record (state.usage()) were the benchmark's, not the collection's, CPU
    usage, (evidence, cont) = batch.stats, batch.stats["phases"]
    phases = search.phases
    budget_ok = evidence["rollouts"] == len(tasks) * (phases[0].rollouts_per_task or 0) and cont["transitions"] >= (
        phases[1].transitions or 0
    )
    figures = {
        "transitions": usage["transitions"],
        "rollouts": usage["rollouts"],
        "failed_rollouts": usage["failed_rollouts"],
        "model_calls": usage["model_calls"],
        "budget": {
            "evidence_rollouts_per_task": phases[0].rollouts_per_task,
            "continuation_transitions": phases[1].transitions,
            "wave_size": phases[1].wave_size,
        },
        "budget_met": budget_ok,
        "actor_rows": len(batch.actor_table),
        "critic_rows": len(batch.critic_table),
        "search_cpu_s": {k: v for k, v in meter.cpu.items() if k != "prepare"},
        "prepare_cpu_s": meter.cpu["prepare"],
        **meter.wave_figures(),
    }
    return figures, batch


def run_baseline(agent: Agent, tasks: list[Task], cfg: dict[str, Any]) -> tuple[dict[str, Any], Batch]:
    """The loop a user would write: k independent rollouts from every root under one
    gather, bounded by the same concurrency; then GRPO advantages and actor rows."""
    k = baseline_group_size(cfg["transitions"], tasks, agent.max_steps)
    estimator = GroupNormalized()

    async def collect() -> tuple[list[Any], list[Rollout | BaseException]]:
        try:
            roots = [await agent.start(task) for task in tasks]
            sem = asyncio.Semaphore(cfg["concurrency"])

            async def one(ti: int, i: int) -> Rollout:
                async with sem:
                    return await agent.rollout(roots[ti], derive_seed(SEED, ti, i))

            jobs = [one(ti, i) for ti in range(len(tasks)) for i in range(k)]
            return roots, list(await asyncio.gather(*jobs, return_exceptions=True))
        finally:
            await agent.policy.aclose()

    roots, results = _run(collect)
    c0 = time.thread_time()
    builder = BatchBuilder("scale-baseline", 0)
    version = str(getattr(agent.policy, "policy_version", "0"))
    transitions = calls = failed = 0
    for ti, task in enumerate(tasks):
        tree = Tree.new(task.id, None, tuple(roots[ti].context.prompt_ids))
        for i in range(k):
            ro = results[ti * k + i]
            if isinstance(ro, BaseException) or ro.leaf.kind == "failed":
                failed += 1
                continue
            turns = tuple(ro.turns)
            transitions += sum(1 for t in turns if t.transition)
            calls += len(turns)
            tree.add_node(tree.ROOT, turns, ro.leaf.kind, steps=ro.leaf.steps, rollout=i)
        advantages = estimator.advantages(list(tree.edges.values()), estimator.values(tree))
        tree_id = f"{task.id}#{ti}"
        for e in tree.edges.values():
            a = advantages.get(e.id)
            if a is None:
                continue
            for j, t in enumerate(e.turns):
                builder.add_turn(
                    task.id, tree_id, e.parent, e.id, j, t.policy_version or version, t.kind,
                    t.prompt_ids, t.completion_ids, t.logprobs, t.loss_mask, float(a), float(t.reward),
                    t.finish_reason,
                )  # fmt: skip
    batch = builder.build({"trees": len(tasks), "transitions": transitions})
    prepare_cpu = time.thread_time() - c0
    figures = {
        "transitions": transitions,
        "rollouts": len(results),
        "failed_rollouts": failed,
        "model_calls": calls,
        "budget": {"rollouts_per_task": k},
        "budget_met": failed == 0 and len(results) == k * len(tasks),
        "actor_rows": len(batch.actor_table),
        "critic_rows": len(batch.critic_table),
        "search_cpu_s": {"plan": 0.0, "graft": 0.0, "score": 0.0, "prefit": 0.0, "other": 0.0},
        "prepare_cpu_s": prepare_cpu,
    }
    return figures, batch


def run_tuned(agent: Agent, tasks: list[Task], cfg: dict[str, Any]) -> tuple[dict[str, Any], Batch]:
    """The same loop as :func:`run_baseline` with its garbage collector tuned, as a
    careful user would write it: ``gc.disable()`` from before the first env reset until
    the batch is built, ``gc.enable()`` after (the arm's clock stops at the built batch
    too). No cyclic collection runs in between, so the arm's GC CPU is nil; cyclic
    garbage waits until the collector is on again."""
    gc.disable()
    try:
        return run_baseline(agent, tasks, cfg)
    finally:
        gc.enable()


#: The arms of a row: FOCUS, the loop a user would write, the same loop with its GC off.
ARMS = {"focus": run_focus, "baseline": run_baseline, "tuned": run_tuned}


def warm_up() -> None:
    """What a process pays once, before either arm's clock starts: Arrow's first array
    imports pandas (pyarrow's pandas shim; about 0.27 s of CPU, 0.13 ms per transition
    at 2k), which a trainer that collects batch after batch pays once."""
    import pyarrow as pa

    pa.array([0])


def run_arm(cfg: dict[str, Any]) -> dict[str, Any]:
    """One arm of one row, in this (fresh) process, against its own server process."""
    sim = SimConfig(
        slots=cfg["slots"],
        latency_s=cfg["latency_s"],
        completion_tokens=cfg["completion_tokens"],
        cache_capacity_tokens=0,  # no prefix trie: the server's CPU stays small next to the arm's
    )
    tasks = reach_target_tasks(cfg["tasks"], seed=1, low=TARGETS[0], high=TARGETS[1])
    with SimServerProcess(sim) as server:
        agent = make_agent(server.url, cfg["concurrency"])
        warm_up()
        rss_before, peak_before = rss_now_mib(), peak_rss_mib()
        before = server.stats()
        arm = ARMS[cfg["arm"]]
        calls = CallMeter().install(agent.policy)
        with GcMeter() as gc_meter, WallMeter(calls) as waits:
            c0, t0 = time.process_time(), time.perf_counter()
            figures, batch = arm(agent, tasks, cfg)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        after = server.stats()
        peak = peak_rss_mib()
        log = server.requests()  # after the peak: the log's JSON is not the arm's memory
    n = max(1, figures["transitions"])
    search_cpu = sum(figures["search_cpu_s"].values())
    prepare_cpu = figures["prepare_cpu_s"]
    requests = max(1, after["requests"] - before["requests"])
    ms = 1000 / n
    out = {
        "arm": cfg["arm"],
        "tasks": cfg["tasks"],
        "transitions_budget": cfg["transitions"],
        **figures,
        "wall_s": wall,
        "transitions_per_s": figures["transitions"] / wall,
        "cpu_s": cpu,
        "cpu_ms_per_transition": cpu * ms,
        "rollout_cpu_ms_per_transition": (cpu - search_cpu - prepare_cpu) * ms,
        "search_cpu_ms_per_transition": search_cpu * ms,
        **{f"{k}_cpu_ms_per_transition": v * ms for k, v in figures["search_cpu_s"].items()},
        "prepare_cpu_ms_per_transition": prepare_cpu * ms,
        "cpu_ms_per_transition_without_prepare": (cpu - prepare_cpu) * ms,
        "gc_cpu_ms_per_transition": gc_meter.cpu * ms,
        "gc_full_collections": gc_meter.full_collections,
        "cpu_ms_per_transition_without_gc": (cpu - gc_meter.cpu) * ms,
        "rss_before_mib": rss_before,
        "peak_rss_mib": peak,
        "peak_rss_before_mib": peak_before,
        "rss_growth_kib_per_transition": (peak - (rss_before or peak_before)) * 1024 / n,
        "server_requests": after["requests"] - before["requests"],
        "server_cpu_ms_per_call": 1000 * (after["cpu_s"] - before["cpu_s"]) / requests,
        "slot_utilisation": (after["busy_slot_s"] - before["busy_slot_s"]) / (cfg["slots"] * wall),
        "server_max_waiting": after["max_waiting"],
        **server_occupancy(log, cfg["slots"]),
        **calls.figures(),
        **waits.figures(),
    }
    del batch
    return out
