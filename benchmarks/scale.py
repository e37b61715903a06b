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
import asyncio
import functools
import gc
import inspect
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.engine import make_agent
from benchmarks.results import ROOT, git_commit, load_average, machine
from focus.agent import Agent, Rollout, derive_seed
from focus.batch import Batch, BatchBuilder
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.env import Task
from focus.estimation import GroupNormalized
from focus.execution import Execution
from focus.priority import Selective
from focus.search import WaveChoice
from focus.testing.simserver import DIGITS, SimConfig, SimServerProcess
from focus.toy import reach_target_tasks
from focus.tree import Tree

#: The goals (cost per transition flat as collections grow), all checked against figures of one run.
GOALS = {
    "focus_vs_baseline_cpu_per_transition": 1.3,  # at every row
    "focus_cpu_per_transition_vs_smallest": 1.2,  # at every size, per task series
    "plan_cpu_per_wave_last_vs_first_quarter": 1.5,  # at the largest size
    "focus_vs_baseline_rss_growth_per_transition": 2.0,  # at the largest size
    "focus_idle_share": 0.10,  # at every row
}
#: The server counts as underfilled while fewer requests than this share of its slots are in service.
UNDERFILLED = 0.5
#: Goals the other way round, at least this at every row: FOCUS / loop transitions per
#: second, against the loop a user would write and against the same loop with its GC off.
THROUGHPUT_GOALS = {
    "focus_vs_baseline_transitions_per_s": 1.0,
    "focus_vs_tuned_transitions_per_s": 1.0,
}
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


# -- measuring -------------------------------------------------------------------------


def _kind(name: str) -> str:
    if name.startswith("plan"):
        return "plan"
    if name.startswith("graft"):
        return "graft"
    if name in ("unscored", "with_predictions", "score_tree") or "predict" in name:
        return "score"
    return "other"


class SearchMeter:
    """Thread CPU spent inside the search's own functions (planning, grafting, scoring).

    Every public function of the ``focus.search`` package is replaced, in each loaded ``focus``
    module that refers to it (the collector, the execution service), by a wrapper that
    times it with ``time.thread_time``; calls nested inside a timed one are not timed
    again. These functions are synchronous, so nothing else runs on the event loop
    while one is timed. Prepare is timed with :meth:`measure`. Events are kept in order,
    so planning, grafting and scoring can be told apart per continuation wave.
    """

    def __init__(self, search: Selective) -> None:
        self.search = search
        self.cpu: dict[str, float] = {
            "plan": 0.0, "graft": 0.0, "score": 0.0, "prefit": 0.0, "other": 0.0, "prepare": 0.0
        }  # fmt: skip
        self.waves: dict[Any, dict[str, Any]] = {}
        self._current: Any = None
        #: Plan CPU of each wave being chosen a slice at a time, until it is chosen.
        self._choosing: dict[tuple[int, int], float] = {}
        #: Timed calls open on each thread (planning runs in worker threads, the wave's
        #: tail on the event loop's): a call nested in one of its own thread's is not timed.
        self._local = threading.local()
        self._undo: list[tuple[Any, str, Any]] = []
        self.t0 = time.perf_counter()

    def install(self) -> SearchMeter:
        import focus.search as fs

        # the package's public functions (defined in its modules, re-exported by it)
        originals = {
            fn: name
            for name, fn in vars(fs).items()
            if inspect.isfunction(fn)
            and fn.__module__.startswith(fs.__name__ + ".")
            and not name.startswith("_")
            and not inspect.iscoroutinefunction(fn)
        }
        for mod_name, mod in list(sys.modules.items()):
            if mod is None or mod_name.startswith(fs.__name__) or not mod_name.startswith("focus."):
                continue
            for attr, value in list(vars(mod).items()):
                if inspect.isfunction(value) and value in originals:
                    self._undo.append((mod, attr, value))
                    setattr(mod, attr, self._timed(originals[value], value))
        # What a refit's calibration reads of each tree, computed in the wave's tail
        # (focus.waves.WaveTail) since h37f: planning's work, done ahead, through a
        # method rather than a public function.
        from focus.search.state import _TreeFacts

        self._undo.append((_TreeFacts, "prefit", _TreeFacts.prefit))
        _TreeFacts.prefit = self._timed_plain("prefit", _TreeFacts.prefit)  # type: ignore[method-assign]
        return self

    def uninstall(self) -> None:
        for mod, attr, value in reversed(self._undo):
            setattr(mod, attr, value)
        self._undo.clear()

    @property
    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @_depth.setter
    def _depth(self, value: int) -> None:
        self._local.depth = value

    def measure(self, kind: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        self._depth += 1
        c0 = time.thread_time()
        try:
            return fn(*args, **kw)
        finally:
            self._depth -= 1
            if not self._depth:
                self.cpu[kind] += time.thread_time() - c0

    def _timed_plain(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` timed as ``kind`` (not nested in another timed call), not tied to a wave."""

        @functools.wraps(fn)
        def timed(*args: Any, **kw: Any) -> Any:
            return self.measure(kind, fn, *args, **kw)

        return timed

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        kind = _kind(name)
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def timed(*args: Any, **kw: Any) -> Any:
            if self._depth:
                return fn(*args, **kw)
            self._depth += 1
            c0 = time.thread_time()
            try:
                out = fn(*args, **kw)
            finally:
                self._depth -= 1
                cpu = time.thread_time() - c0
                self.cpu[kind] += cpu
            self._record(kind, signature.bind(*args, **kw).arguments, out, cpu)
            return out

        return timed

    def _record(self, kind: str, arguments: dict[str, Any], out: Any, cpu: float) -> None:
        """Attach one timed call to the continuation wave it belongs to (a wave chosen a
        slice at a time, ``plan_begin`` / ``plan_choose`` / ``plan_chosen``: the sum of
        its calls, the wave's entry made at the last)."""
        choice = arguments.get("choice", out if isinstance(out, WaveChoice) else None)
        if kind == "plan" and choice is not None:
            key = (choice.phase_index, choice.wave_index)
            self._choosing[key] = self._choosing.get(key, 0.0) + cpu
            if not hasattr(out, "planned"):
                return
            arguments, cpu = {"state": choice.state, "phase_index": key[0]}, self._choosing.pop(key)
        if kind == "plan":
            wave = arguments.get("wave_index", len(self.waves))
            if hasattr(out, "planned"):  # plan_next / plan_ahead: a state with the new wave planned
                new = out.planned[-1] if out is not arguments.get("state") and out.planned else None
                jobs = new.jobs if new is not None else ()
                wave = new.wave_index if new is not None else wave
            else:
                jobs = getattr(out, "jobs", out)
            n = len(jobs) if isinstance(jobs, (tuple, list)) else 0
            phase = arguments.get("phase_index")
            if not n or phase is None or self.search.phases[phase].is_evidence:
                self._current = None
                return
            self._current = (phase, wave)
            self.waves[self._current] = {
                "phase": phase,
                "wave": wave,
                "jobs": n,
                "at_s": round(time.perf_counter() - self.t0, 4),
                "plan_ms": 1000 * cpu,
                "graft_ms": 0.0,
                "score_ms": 0.0,
            }
            return
        if kind == "graft":
            plan = arguments.get("plan")
            key = (getattr(plan, "phase_index", None), getattr(plan, "wave_index", None))
            self._current = key if key in self.waves else self._current
        entry = self.waves.get(self._current)
        if entry is not None and kind in ("graft", "score"):
            entry[f"{kind}_ms"] += 1000 * cpu

    def wave_figures(self) -> dict[str, Any]:
        waves = [{k: round(v, 3) if isinstance(v, float) else v for k, v in w.items()} for w in self.waves.values()]
        out: dict[str, Any] = {"continuation_waves": len(waves), "per_wave": waves}
        if waves:
            q = max(1, len(waves) // 4)
            for name, part in (("first", waves[:q]), ("last", waves[-q:])):
                for k in ("plan", "graft", "score"):
                    out[f"{k}_cpu_ms_per_wave_{name}_quarter"] = sum(w[f"{k}_ms"] for w in part) / len(part)
            first = out["plan_cpu_ms_per_wave_first_quarter"]
            out["plan_cpu_per_wave_last_vs_first_quarter"] = (
                out["plan_cpu_ms_per_wave_last_quarter"] / first if first > 0 else None
            )
        return out


class GcMeter:
    """Thread CPU inside Python's cyclic garbage collector (``gc.callbacks``), and the
    number of full (generation 2) collections. The baseline's loop runs with the default
    GC, as a user's loop would; ``Execution`` keeps the trees out of it while a wave runs.
    What that difference costs is this figure."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.full_collections = 0
        self._t: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.thread_time()
        elif self._t is not None:
            self.cpu += time.thread_time() - self._t
            self.full_collections += info.get("generation") == 2
            self._t = None

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


#: Shortest stretch with no call in flight that :class:`CallMeter` lists on its own
#: (``idle_gaps_ms``): shorter ones are the loop's turns between calls, not barriers.
GAP_LISTED_S = 0.002


class CallMeter:
    """Model calls in flight from this process over time: the share of the collection
    during which none is (``idle_share``), counted as it goes, nothing stored per call.

    The window runs from the first call's start to the last call's end; every stretch
    inside it with no call in flight (a wave's barrier: grafting, scoring and planning
    the next wave after the last call of one has returned) counts as idle. Nothing else
    sends to the server, so the server is idle at least that long; it can be idle
    longer while calls are in flight here (answers waiting in sockets for a busy
    process), which :func:`server_occupancy` counts and a loaded machine inflates,
    while this share stays a property of the collection's schedule."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.calls = 0
        self.first: float | None = None
        self.last_end: float | None = None
        self.idle_s = 0.0
        #: The stretches with no call in flight of at least GAP_LISTED_S: the barriers.
        self.gaps: list[tuple[float, float]] = []

    def install(self, policy: Any) -> CallMeter:
        inner = policy.sample_on_route

        async def sample_on_route(prompt_ids: Any, params: Any, route: Any) -> Any:
            now = time.perf_counter()
            if not self.in_flight:
                if self.last_end is None:
                    self.first = now
                else:
                    self.idle_s += now - self.last_end
                    if now - self.last_end >= GAP_LISTED_S:
                        self.gaps.append((self.last_end, now))
            self.in_flight += 1
            self.calls += 1
            try:
                return await inner(prompt_ids, params, route)
            finally:
                self.in_flight -= 1
                if not self.in_flight:
                    self.last_end = time.perf_counter()

        policy.sample_on_route = sample_on_route
        return self

    def figures(self) -> dict[str, Any]:
        window = (self.last_end - self.first) if self.first is not None and self.last_end is not None else 0.0
        return {
            "calls_window_s": window,
            "idle_s": self.idle_s,
            "idle_share": self.idle_s / window if window > 0 else None,
            # each barrier: (ms into the window, ms long), largest first
            "idle_gaps_ms": sorted(
                ((round(1000 * (a - (self.first or a)), 1), round(1000 * (b - a), 1)) for a, b in self.gaps),
                key=lambda g: -g[1],
            ),
        }


def _rss_now_mib() -> float | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _run(make: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine on a fresh loop; the result leaves through a holder, not as the
    main task's result (Python 3.11's ``asyncio.run`` formats that repr on exit, about a
    second of CPU for a large state)."""
    out: list[Any] = []

    async def go() -> None:
        out.append(await make())

    asyncio.run(go())
    return out[0]


def server_occupancy(log: Sequence[Sequence[Any]], slots: int) -> dict[str, Any]:
    """How much of the collection the server spent without work, from its request log
    (``GET /requests``: arrival, slot acquired and done, in seconds, per request).

    The window runs from the first request's arrival to the last one's answer, so the
    env resets before it and the batch preparation after it do not count; inside it,
    the server is *idle* while no request is in it (queued or in service), and
    *underfilled* while fewer than ``UNDERFILLED`` x ``slots`` are in service. Both as
    shares of the window: what a wave barrier costs a real server is the idle share
    (nothing to batch at all) and, less sharply, the underfilled one (small batches
    while a wave's tail drains and the next is planned)."""
    if not log:
        return {"server_window_s": 0.0, "server_idle_share": None, "server_underfilled_share": None}
    present: list[tuple[float, int]] = []
    serving: list[tuple[float, int]] = []
    for row in log:
        arrived, acquired, done = float(row[0]), float(row[1]), float(row[2])
        present += ((arrived, 1), (done, -1))
        serving += ((acquired, 1), (done, -1))
    start, end = min(t for t, _ in present), max(t for t, _ in present)
    window = end - start

    def time_below(events: list[tuple[float, int]], bound: float) -> float:
        """Seconds of the window during which the count of open intervals is below ``bound``
        (an interval that closes at the instant another opens leaves no gap)."""
        events.sort(key=lambda e: (e[0], -e[1]))
        below, level, last = 0.0, 0, start
        for t, step in events:
            if level < bound:
                below += t - last
            level += step
            last = t
        return below

    idle = time_below(present, 1)
    low = time_below(serving, UNDERFILLED * slots)
    return {
        "server_window_s": window,
        "server_idle_share": idle / window if window > 0 else 0.0,
        "server_underfilled_share": low / window if window > 0 else 0.0,
    }


# -- the two arms ----------------------------------------------------------------------


def run_focus(agent: Agent, tasks: list[Task], cfg: dict[str, Any]) -> tuple[dict[str, Any], Batch]:
    search = focus_search(cfg["transitions"], tasks, agent.max_steps, cfg["concurrency"])
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
            return await collector.run_search(tasks)
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
        rss_before, peak_before = _rss_now_mib(), _peak_rss_mib()
        before = server.stats()
        arm = ARMS[cfg["arm"]]
        calls = CallMeter().install(agent.policy)
        with GcMeter() as gc_meter:
            c0, t0 = time.process_time(), time.perf_counter()
            figures, batch = arm(agent, tasks, cfg)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        after = server.stats()
        peak = _peak_rss_mib()
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
    }
    del batch
    return out


# -- the run ---------------------------------------------------------------------------


def size_label(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


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


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ratios the issue's goals name, and whether they are met."""
    vs_baseline = {
        r["key"]: _ratio(r["focus"]["cpu_ms_per_transition"], r["baseline"]["cpu_ms_per_transition"]) for r in rows
    }
    vs_baseline_np = {
        r["key"]: _ratio(
            r["focus"]["cpu_ms_per_transition_without_prepare"], r["baseline"]["cpu_ms_per_transition_without_prepare"]
        )
        for r in rows
    }
    vs_baseline_ng = {
        r["key"]: _ratio(
            r["focus"]["cpu_ms_per_transition_without_gc"], r["baseline"]["cpu_ms_per_transition_without_gc"]
        )
        for r in rows
    }
    throughput = {r["key"]: _ratio(r["focus"]["transitions_per_s"], r["baseline"]["transitions_per_s"]) for r in rows}
    smallest = min(r["transitions_budget"] for r in rows)
    base = {r["series"]: r for r in rows if r["transitions_budget"] == smallest}
    if "few" in base:
        base.setdefault("many", base["few"])  # both series start from one row where few == many
    growth = {}
    for r in rows:
        b = base.get(r["series"])
        if b is not None and r is not b:
            growth[r["key"]] = _ratio(r["focus"]["cpu_ms_per_transition"], b["focus"]["cpu_ms_per_transition"])
    largest = max(r["transitions_budget"] for r in rows)
    quarters = {r["key"]: r["focus"].get("plan_cpu_per_wave_last_vs_first_quarter") for r in rows}
    at_largest = {k: v for k, v in quarters.items() if v is not None and k.startswith(size_label(largest) + "_")}

    def worst(values: dict[str, float | None]) -> float | None:
        vals = [v for v in values.values() if v is not None]
        return max(vals) if vals else None

    ratios = {
        "focus_vs_baseline_cpu_per_transition": vs_baseline,
        "focus_vs_baseline_cpu_per_transition_without_prepare": vs_baseline_np,
        "focus_vs_baseline_cpu_per_transition_without_gc": vs_baseline_ng,
        "focus_vs_baseline_transitions_per_s": throughput,
        "focus_cpu_per_transition_vs_smallest": growth,
        "smallest_size": size_label(smallest),
        "plan_cpu_per_wave_last_vs_first_quarter": quarters,
        "plan_cpu_per_wave_last_vs_first_quarter_at_largest": at_largest,
        "largest_size": size_label(largest),
    }
    checked = {
        "focus_vs_baseline_cpu_per_transition": worst(vs_baseline),
        "focus_cpu_per_transition_vs_smallest": worst(growth),
        "plan_cpu_per_wave_last_vs_first_quarter": worst(at_largest),
    }
    memory_idle = summarise_memory_and_idle(rows)
    ratios.update(memory_idle)
    checked["focus_vs_baseline_rss_growth_per_transition"] = worst(
        memory_idle["focus_vs_baseline_rss_growth_per_transition_at_largest"]
    )
    checked["focus_idle_share"] = worst(memory_idle["focus_idle_share"])
    goals = {k: {"goal": GOALS[k], "worst": v, "met": v is not None and v <= GOALS[k]} for k, v in checked.items()}
    return with_tuned_arm({"ratios": ratios, "goals": goals}, rows)


def with_tuned_arm(summary: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary`` with FOCUS / GC-tuned loop ratios per row (throughput, CPU per
    transition) and the throughput goals (:data:`THROUGHPUT_GOALS`: the worst row is
    the lowest ratio, met at or above the bound)."""
    ratios = dict(summary["ratios"])
    ratios["focus_vs_tuned_transitions_per_s"] = {
        r["key"]: _ratio(r["focus"]["transitions_per_s"], r["tuned"]["transitions_per_s"]) for r in rows if "tuned" in r
    }
    ratios["focus_vs_tuned_cpu_per_transition"] = {
        r["key"]: _ratio(r["focus"]["cpu_ms_per_transition"], r["tuned"]["cpu_ms_per_transition"])
        for r in rows
        if "tuned" in r
    }
    goals = dict(summary["goals"])
    for k, bound in THROUGHPUT_GOALS.items():
        vals = [v for v in ratios[k].values() if v is not None]
        worst = min(vals) if vals else None
        goals[k] = {"goal": bound, "worst": worst, "met": worst is not None and worst >= bound, "at_least": True}
    return {**summary, "ratios": ratios, "goals": goals}


def summarise_memory_and_idle(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Memory per transition, FOCUS / baseline (RSS growth over the RSS before
    collecting, per transition; and peak RSS), at every row and at the largest size;
    the share of the collection with no model call in flight (:class:`CallMeter`), and
    the server's idle and underfilled shares (:func:`server_occupancy`), per arm."""
    largest = size_label(max(r["transitions_budget"] for r in rows)) + "_"
    growth = {
        r["key"]: _ratio(r["focus"]["rss_growth_kib_per_transition"], r["baseline"]["rss_growth_kib_per_transition"])
        for r in rows
    }
    return {
        "focus_vs_baseline_rss_growth_per_transition": growth,
        "focus_vs_baseline_rss_growth_per_transition_at_largest": {
            k: v for k, v in growth.items() if k.startswith(largest)
        },
        "focus_vs_baseline_peak_rss": {
            r["key"]: _ratio(r["focus"]["peak_rss_mib"], r["baseline"]["peak_rss_mib"]) for r in rows
        },
        "focus_idle_share": {r["key"]: r["focus"].get("idle_share") for r in rows},
        "baseline_idle_share": {r["key"]: r["baseline"].get("idle_share") for r in rows},
        "focus_server_idle_share": {r["key"]: r["focus"].get("server_idle_share") for r in rows},
        "baseline_server_idle_share": {r["key"]: r["baseline"].get("server_idle_share") for r in rows},
        "focus_server_underfilled_share": {r["key"]: r["focus"].get("server_underfilled_share") for r in rows},
        "baseline_server_underfilled_share": {r["key"]: r["baseline"].get("server_underfilled_share") for r in rows},
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| size | tasks | FOCUS t/s | baseline t/s | FOCUS CPU ms/t (rollout + search + prepare) "
        "| baseline CPU ms/t (rollout + prepare) | CPU ratio | plan ms/wave first -> last quarter "
        "| GC ms/t FOCUS / baseline | peak RSS MiB FOCUS / baseline |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        f, b = r["focus"], r["baseline"]
        q = (
            f"{f['plan_cpu_ms_per_wave_first_quarter']:.0f} -> {f['plan_cpu_ms_per_wave_last_quarter']:.0f}"
            if f.get("continuation_waves")
            else ""
        )
        lines.append(
            f"| {size_label(r['transitions_budget'])} | {r['tasks']} | {f['transitions_per_s']:,.0f} "
            f"| {b['transitions_per_s']:,.0f} | {f['cpu_ms_per_transition']:.2f} "
            f"({f['rollout_cpu_ms_per_transition']:.2f} + {f['search_cpu_ms_per_transition']:.2f} "
            f"+ {f['prepare_cpu_ms_per_transition']:.2f}) | {b['cpu_ms_per_transition']:.2f} "
            f"({b['rollout_cpu_ms_per_transition']:.2f} + {b['prepare_cpu_ms_per_transition']:.2f}) "
            f"| {f['cpu_ms_per_transition'] / b['cpu_ms_per_transition']:.2f} | {q} "
            f"| {f['gc_cpu_ms_per_transition']:.2f} / {b['gc_cpu_ms_per_transition']:.2f} "
            f"| {f['peak_rss_mib']:.0f} / {b['peak_rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def memory_idle_table(rows: list[dict[str, Any]]) -> str:
    """Memory per transition, the share with no call in flight and the server's idle and
    underfilled shares, per row."""

    def share(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.3f}"

    lines = [
        "| size | tasks | RSS growth KiB/t FOCUS / baseline | ratio | peak RSS MiB FOCUS / baseline "
        "| idle share FOCUS / baseline | server idle share FOCUS / baseline | underfilled share FOCUS / baseline |",
        "|" + "---|" * 8,
    ]
    for r in rows:
        f, b = r["focus"], r["baseline"]
        g = _ratio(f["rss_growth_kib_per_transition"], b["rss_growth_kib_per_transition"])
        lines.append(
            f"| {size_label(r['transitions_budget'])} | {r['tasks']} "
            f"| {f['rss_growth_kib_per_transition']:.2f} / {b['rss_growth_kib_per_transition']:.2f} "
            f"| {'n/a' if g is None else f'{g:.2f}'} | {f['peak_rss_mib']:.0f} / {b['peak_rss_mib']:.0f} "
            f"| {share(f.get('idle_share'))} / {share(b.get('idle_share'))} "
            f"| {share(f.get('server_idle_share'))} / {share(b.get('server_idle_share'))} "
            f"| {share(f.get('server_underfilled_share'))} / {share(b.get('server_underfilled_share'))} |"
        )
    return "\n".join(lines)


def arms_table(rows: list[dict[str, Any]]) -> str:
    """FOCUS against both loops per row: transitions per second and CPU per transition."""
    head = (
        "| size | tasks | t/s FOCUS / naive / tuned | t/s ratio FOCUS / naive, / tuned "
        "| CPU ms/t FOCUS / naive / tuned | CPU ratio FOCUS / naive, / tuned |"
    )
    lines = [head, "|" + "---|" * 6]
    for r in rows:
        f, b, u = r["focus"], r["baseline"], r["tuned"]
        tps, cpu = "transitions_per_s", "cpu_ms_per_transition"
        lines.append(
            f"| {size_label(r['transitions_budget'])} | {r['tasks']} "
            f"| {f[tps]:,.0f} / {b[tps]:,.0f} / {u[tps]:,.0f} | {f[tps] / b[tps]:.2f}, {f[tps] / u[tps]:.2f} "
            f"| {f[cpu]:.3f} / {b[cpu]:.3f} / {u[cpu]:.3f} | {f[cpu] / b[cpu]:.2f}, {f[cpu] / u[cpu]:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
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
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        out = run_arm(json.loads(args.child))
        args.child_out.write_text(json.dumps(out))
        return out
    if args.quick:
        args.sizes, args.few_tasks, args.tasks_per_1k = [300, 1000], 6, 20.0
        args.slots, args.latency_ms, args.concurrency = 16, 2.0, 32
        args.repeats, args.repeat_max_size = min(args.repeats, 2), 300
    t0 = time.perf_counter()
    figures: dict[str, Any] = {
        "machine": machine(),
        "git_commit": git_commit(),
        "command": " ".join(["python -m benchmarks.scale", *(argv if argv is not None else sys.argv[1:])]),
        "load_average_at_start": load_average(),
        "config": {
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
        },
    }
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
                cfg = {
                    "arm": arm,
                    "transitions": n,
                    "tasks": tasks,
                    "slots": args.slots,
                    "latency_s": args.latency_ms / 1000,
                    "completion_tokens": args.tokens,
                    "concurrency": args.concurrency,
                }
                runs.setdefault(key, {}).setdefault(arm, []).append(run_child(cfg, args.timeout_s))
            row["load_average_after"] = load_average()
            f, b, u = runs[key]["focus"][-1], runs[key]["baseline"][-1], runs[key]["tuned"][-1]
            print(
                f"{key} (run {rep + 1}): focus {f['transitions']} t, {f['transitions_per_s']:.0f} t/s, "
                f"{f['cpu_ms_per_transition']:.3f} ms/t; baseline {b['transitions']} t, "
                f"{b['transitions_per_s']:.0f} t/s, {b['cpu_ms_per_transition']:.3f} ms/t; tuned "
                f"{u['transitions_per_s']:.0f} t/s, {u['cpu_ms_per_transition']:.3f} ms/t; "
                f"load {row['load_average_after']}",
                file=sys.stderr,
                flush=True,
            )
    for key, row in rows.items():
        for arm, done in runs[key].items():
            row[arm] = median_run(done)
            row[f"{arm}_cpu_ms_per_transition_each_run"] = [r["cpu_ms_per_transition"] for r in done]
    rows = list(rows.values())
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
