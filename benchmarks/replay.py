"""Planning and prepare CPU of one collection, replayed from its stored rollouts.

A collection is captured once (:func:`capture`: run live, every wave's plan, rollouts and
critic predictions kept, and the live batch's digest), then replayed as often as wanted
(:func:`replay`): every wave is planned, grafted and scored again exactly as the
collector does it, and the batch prepared, with the CPU (``time.thread_time``, GC off)
of each phase apart. The replay checks that every plan is the live run's, job for job,
and that the batch is the live one, byte for byte, so a change meant to cut CPU without
changing a number is measured and checked in one command. Replaying the same capture
before and after a change compares CPU on a loaded machine far more tightly than a live
run, whose rollouts and event loop share the core with whatever else runs.

The replay follows the collector's schedule (:mod:`focus.waves`): while a continuation
wave runs, each tree whose jobs have finished is grafted (:func:`focus.search.graft_tree`)
and scored and ranked (:func:`focus.search.score_tree`); the replay does that for every
tree of the wave (*tail*: as if every tree finished before the last one, the best the
tail can do). What the model server waits for is the *barrier*: the merge
(:func:`focus.search.graft`), the rest of the scores, and the next plan, split into the
calibration (:meth:`focus.search.SearchState.calibration`: the noise-model fits), the
rankings (building a tree's :class:`focus.ranking.TreeRanking` from scratch, the first
plan after the evidence and every plan after a refit of the calibration, or bringing it
up to date) and the greedy choice. The evidence wave is grafted in the tail and scored at
the barrier, as live.

Sources: ``synthetic`` (``focus.synthetic`` MDPs in process, a row-wise
:class:`~focus.synthetic.SyntheticCritic`; seconds) or ``scale`` (benchmarks/scale.py's
focus arm: ReachTarget over HTTP against the simulated server, ``ConstantCritic``)::

    .venv/bin/python -m benchmarks.replay --source scale --transitions 40000 --tasks 800 --save /tmp/c.pkl
    .venv/bin/python -m benchmarks.replay --load /tmp/c.pkl --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from focus.agent import Agent
from focus.batch import Batch, BatchBuilder
from focus.collector import Collector, noise_model_statistics
from focus.critic import ConstantCritic, Critic
from focus.env import Task
from focus.estimation import Estimator, critic_targets, truncated_segments
from focus.execution import Execution
from focus.journal import EVIDENCE_SCORES, MemoryJournal, scores_step
from focus.priority import Priority, Selective
from focus.search import (
    SearchState,
    WavePlan,
    graft,
    graft_tree,
    plan_ahead,
    plan_begin,
    plan_choose,
    plan_chosen,
    plan_rank,
    score_tree,
    with_predictions,
)
from focus.statistics import collection_statistics
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.waves import CHOOSE_SLICE, Landed

_T = TypeVar("_T")

#: A plan as compared with the live run's: (tree, node, seed, branch) of every job.
JobKey = tuple[tuple[int, int, int, int], ...]


def job_key(plan: WavePlan) -> JobKey:
    return tuple((j.tree_index, j.node_id, j.seed, j.branch) for j in plan.jobs)


@dataclass
class Capture:
    """What a replay needs of one live collection (pickles; rollouts included)."""

    source: str
    search: Priority
    estimator: Estimator
    collection_id: str
    iteration: int
    policy_version: str
    #: The state with the trees' roots only (pickled), before the evidence wave.
    roots: bytes
    #: Every wave launched, in order (the evidence first): its plan's jobs, and what landed.
    plans: list[JobKey] = field(default_factory=list)
    landed: list[Landed] = field(default_factory=list)
    #: The critic's predictions for the evidence, then for each continuation wave (merged
    #: over the tail and the barrier, in the order one call at the barrier makes them).
    scores: list[dict[tuple[int, int], tuple[float | None, float | None]]] = field(default_factory=list)
    batch_digest: str = ""
    transitions: int = 0
    live_wall_s: float = 0.0
    #: Whether the collector scores each tree as its evidence finishes
    #: (:meth:`focus.collector.Collector.scores_evidence_ahead`).
    evidence_ahead: bool = True


class _Recording(Collector):
    """The collector, keeping each landed wave, its plan and the roots."""

    roots: bytes = b""
    plans: list[JobKey]
    landed: list[Landed]

    async def start(self, tasks: Sequence[Task]) -> SearchState:
        state = await super().start(tasks)
        self.roots = pickle.dumps(state)
        return state

    async def land(self, state: SearchState, launched: Any, *args: Any, **kw: Any) -> Any:
        # the plan as landed: a continuation wave is launched as it is chosen (waves.launch_choosing)
        self.plans.append(job_key(launched.plan))
        new, landed = await super().land(state, launched, *args, **kw)
        self.landed.append(landed)
        return new, landed


def batch_digest(batch: Batch) -> str:
    """SHA-256 (16 hex digits) of the batch's tables (Arrow IPC, schema metadata left
    out) and its statistics."""
    h = hashlib.sha256()
    for table in (batch.actor_table, batch.critic_table):
        sink = pa.BufferOutputStream()
        table = table.replace_schema_metadata(None).combine_chunks()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        h.update(sink.getvalue().to_pybytes())
    h.update(json.dumps(batch.stats, sort_keys=True, default=repr).encode())
    return h.hexdigest()[:16]


def _continuation(transitions: int, wave_size: int) -> Selective:
    evidence, cont = Selective().phases
    return Selective(phases=(evidence, cont.model_copy(update={"transitions": transitions, "wave_size": wave_size})))


def _collect(make: Callable[[], tuple[Agent, Selective, Critic, list[Task]]], concurrency: int, source: str) -> Capture:
    agent, search, critic, tasks = make()
    col = _Recording(
        agent, search, critic, execution=Execution(max_concurrency=concurrency), collection_id="replay", seed=0
    )
    col.plans, col.landed = [], []
    journal = MemoryJournal()

    async def go() -> SearchState:
        try:
            return await col.search(tasks, journal)
        finally:
            aclose = getattr(agent.policy, "aclose", None)
            if aclose is not None:
                await aclose()

    t0 = time.perf_counter()
    state = asyncio.run(go())
    wall = time.perf_counter() - t0
    cont = col.priority.phases[1]
    scores = [dict(asyncio.run(journal.recorded(EVIDENCE_SCORES)) or {})]
    scores += [dict(asyncio.run(journal.recorded(scores_step(1, w))) or {}) for w in range(state.waves_done(1))]
    assert not cont.is_evidence and len(col.priority.phases) == 2
    return Capture(
        source, col.priority, col.estimator, col.collection_id, col.iteration,
        str(getattr(agent.policy, "policy_version", "0")), col.roots, col.plans, col.landed, scores,
        batch_digest(col.prepare(state)), state.usage().transitions, wall, col.scores_evidence_ahead(),
    )  # fmt: skip


def capture(source: str, transitions: int, tasks: int, wave_size: int = 512) -> Capture:
    """Run one collection live and keep what :func:`replay` needs. ``synthetic``: the
    continuation budget is ``transitions``; ``scale``: the whole collection is
    ``transitions`` in expectation, as in benchmarks/scale.py."""
    if source == "synthetic":

        def make() -> tuple[Agent, Selective, Critic, list[Task]]:
            names = list(SHAPES)
            mdps = [SHAPES[names[i % len(names)]](i) for i in range(tasks)]
            agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
            work = [Task(f"t{i}", {"mdp": i}) for i in range(tasks)]
            return agent, _continuation(transitions, wave_size), SyntheticCritic(mdps, 0.1), work

        return _collect(make, wave_size, source)
    if source != "scale":
        raise ValueError(f"unknown source {source!r}: synthetic or scale")
    from benchmarks import scale
    from benchmarks.engine import make_agent
    from focus.testing.simserver import SimConfig, SimServerProcess
    from focus.toy import reach_target_tasks

    sim = SimConfig(slots=256, latency_s=0.005, completion_tokens=3, cache_capacity_tokens=0)
    work = reach_target_tasks(tasks, seed=1, low=scale.TARGETS[0], high=scale.TARGETS[1])
    with SimServerProcess(sim) as server:

        def make_scale() -> tuple[Agent, Selective, Critic, list[Task]]:
            agent = make_agent(server.url, wave_size)
            search = scale.focus_search(transitions, work, agent.max_steps, wave_size)
            return agent, search, ConstantCritic(scale.CRITIC_VALUE), work

        return _collect(make_scale, wave_size, source)


class Clock:
    """Thread CPU per phase name."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        #: Plans of each kind (first, refit, wave, last).
        self.count: dict[str, int] = {}

    def __call__(self, name: str, fn: Callable[..., _T], *args: Any, **kw: Any) -> _T:
        c0 = time.thread_time()
        out = fn(*args, **kw)
        self.add(name, time.thread_time() - c0)
        return out

    def add(self, name: str, cpu: float) -> None:
        self.cpu[name] = self.cpu.get(name, 0.0) + cpu


class ReplayMismatch(AssertionError):
    """The replay planned or prepared something the live run did not."""


def _plan(state: SearchState, cap: Capture, wave: int, clock: Clock, last: Any) -> tuple[SearchState, Any]:
    """Plan continuation wave ``wave`` as the collector does (:func:`focus.waves.launch_choosing`,
    then :func:`focus.search.plan_ahead`), its parts timed apart: the calibration, the
    rankings brought up to date (:func:`focus.search.plan_rank`: every tree's after the
    evidence or a refit, ``rank_build``, else the trees changed since the last plan,
    ``rank_update``), and the rest (the wave begun and its first slice of jobs,
    ``greedy``, and the rest, ``greedy_tail``, which the collector chooses while the
    first jobs run). ``last``: the previous plan's calibration; the parts are named
    ``first.*`` (no previous plan), ``refit.*`` (a new calibration), ``wave.*`` or, for
    the plan that finds nothing more to do, ``last.*``. The rankings are brought up to
    date before the choice, so a wave's leading exploration picks
    (``focus.search.planning._Greedy.lead``, which a collector starts before it fits
    and ranks) are not modelled: here the fit and the rankings count in the barrier
    whether or not a lead runs beside them."""
    search, pi = cap.search, 1
    own = Clock()
    choice = own("greedy", plan_begin, state, search, pi)
    if choice is None or choice.done:
        # the collector's plan stops at the budget (focus.search.planning._wave_greedy):
        # no fit, no ranking
        state = own("greedy", plan_ahead, state, search, pi)
        if state.planned or wave + 1 < len(cap.plans):
            raise ReplayMismatch(f"continuation wave {wave}: the replay plans nothing, the live run a wave")
        for name, cpu in own.cpu.items():
            clock.add(f"last.{name}", cpu)
        clock.count["last"] = clock.count.get("last", 0) + 1
        return state, last
    calib = own("calibration", state.calibration, search)
    kind = "first" if last is None else "refit" if calib is not last else "wave"
    own("rank_update" if kind == "wave" else "rank_build", plan_rank, choice)
    own("greedy", plan_choose, choice, CHOOSE_SLICE)  # the wave's first jobs wait for this slice
    while not choice.done:  # the rest is chosen while those run: not the barrier
        own("greedy_tail", plan_choose, choice, CHOOSE_SLICE)
    state = own("greedy_tail", plan_chosen, choice)
    state = own("greedy", plan_ahead, state, search, pi)
    want = cap.plans[wave + 1] if wave + 1 < len(cap.plans) else ()
    got = job_key(state.planned[0]) if state.planned else ()
    if got != want:
        raise ReplayMismatch(f"continuation wave {wave}: the replay plans {len(got)} jobs, the live run {len(want)}")
    kind = kind if got else "last"
    for name, cpu in own.cpu.items():
        clock.add(f"{kind}.{name}", cpu)
    clock.count[kind] = clock.count.get(kind, 0) + 1
    return state, calib


def _tail(
    state: SearchState, cap: Capture, index: int, clock: Clock, score: bool, rank: bool = True, name: str = "tail"
) -> dict[int, Any]:
    """The wave's trees grafted (and with ``score`` scored, and with ``rank`` ranked) one
    by one, as :class:`focus.waves.WaveTail` does while the wave runs."""
    landed = cap.landed[index]
    plan, rollouts = landed.plan, landed.rollouts
    if state.planned and job_key(state.planned[0]) == job_key(plan):
        # the plan object the state holds, as the collector's tail grafts it: an equal
        # copy (the capture's) makes every graft_tree compare the wave's jobs one by one
        plan = state.planned[0]
    phase_name = cap.search.phases[plan.phase_index].name
    by_tree: dict[int, list[int]] = {}
    for i, job in enumerate(plan.jobs):
        by_tree.setdefault(job.tree_index, []).append(i)
    preds: dict[int, dict[tuple[int, int], tuple[float | None, float | None]]] = {}
    for key, value in cap.scores[index].items():
        preds.setdefault(key[0], {})[key] = value
    c0 = time.thread_time()
    search = cap.search
    calib = (state.next_calibration(search) or state.calibration(search)) if score and rank else None
    prefit = state.may_refit(search, len(plan.jobs))  # what the fit reads of every tree, done here (WaveTail)
    if prefit:
        for ti in range(len(state.trees)):
            if ti not in by_tree:
                state.facts(ti).prefit(search)
    elif calib is not None and state.refits_next(search):  # a lagged refit: every tree ranked under it
        for ti in range(len(state.trees)):
            if ti not in by_tree:
                state.facts(ti).ranked(search, calib, plan.phase_index, state.seed)
    parts = {}
    for ti, jobs in by_tree.items():
        part = graft_tree(state, plan, ti, [rollouts[i] for i in jobs], phase_name, jobs)
        if prefit:
            part.facts.prefit(search, scored=False)
        if score:
            part = score_tree(state, search, part, preds.get(ti, {}), rank, calib)
            if prefit:
                part.facts.prefit(search, seed=state.seed)
        parts[ti] = part
    clock.add(name, time.thread_time() - c0)
    return parts


def replay_search(cap: Capture, clock: Clock) -> SearchState:
    """The capture's collection planned, grafted and scored again; raises
    :class:`ReplayMismatch` where a plan differs from the live run's."""
    search = cap.search
    state: SearchState = pickle.loads(cap.roots)
    evidence = cap.landed[0].plan
    if job_key(evidence) != cap.plans[0]:
        raise ReplayMismatch("the evidence wave differs from the live run's")
    ahead = cap.evidence_ahead  # scored as its trees finish, not ranked (the calibration needs them all)
    parts = _tail(state, cap, 0, clock, score=ahead, rank=False, name="evidence.tail")
    ev = cap.landed[0]
    state = clock("evidence.merge", graft, state, evidence, ev.rollouts, search.phases[0].name, ev.wall_s, parts)
    if not ahead:
        state = clock("evidence.score", with_predictions, state, cap.scores[0])
    calib = None
    for wave in range(len(cap.landed) - 1):
        state, calib = _plan(state, cap, wave, clock, calib)
        landed = cap.landed[wave + 1]
        parts = _tail(state, cap, wave + 1, clock, score=True)
        state = clock("merge", graft, state, landed.plan, landed.rollouts, search.phases[1].name, landed.wall_s, parts)
    state, _ = _plan(state, cap, len(cap.landed) - 1, clock, calib)
    return state


def replay_prepare(cap: Capture, trees: Sequence[Any], clock: Clock) -> Batch:
    """:meth:`focus.collector.Collector.prepare`'s batch, its parts timed apart (the
    same steps in the same order; the digest check holds them to it)."""
    est = cap.estimator
    out = BatchBuilder(cap.collection_id, cap.iteration)
    noise = clock("prepare.noise", est.noise, trees) if est.kappa is None else None
    excluded = 0
    tick = time.thread_time
    for ti, tree in enumerate(trees):
        tree_id, task_id = f"{tree.task_id}#{ti}", tree.task_id
        c0 = tick()
        values = est.values(tree, noise)
        adv = est.advantages(list(tree.edges.values()), values)
        truncated = truncated_segments(tree)
        c1 = tick()
        for e in tree.edges.values():
            a = adv.get(e.id)
            if a is None:
                excluded += 1
                continue
            for j, t in enumerate(e.turns):
                out.add_turn(
                    task_id, tree_id, e.parent, e.id, j, t.policy_version or cap.policy_version, t.kind,
                    t.prompt_ids, t.completion_ids, t.logprobs, t.loss_mask, float(a), float(t.reward),
                    t.finish_reason, e.id in truncated,
                )  # fmt: skip
        c2 = tick()
        targets = sorted(critic_targets(tree, gamma=est.gamma, truncation=est.truncation).items())
        c3 = tick()
        for nid, tgt in targets:
            node = tree.nodes[nid]
            out.add_checkpoint(task_id, tree_id, nid, node.context_ids, tgt.target, tgt.weight, node.value)
        c4 = tick()
        clock.add("prepare.actor_backups", c1 - c0)
        clock.add("prepare.critic_targets", c3 - c2)
        clock.add("prepare.rows", (c2 - c1) + (c4 - c3))
    stats = clock("prepare.statistics", collection_statistics, cap.search.phases, trees, excluded_segments=excluded)
    if noise is not None:
        stats["noise_model"] = noise_model_statistics(noise)
    return clock("prepare.build", out.build, stats)


def replay(cap: Capture) -> Clock:
    """One replay of ``cap``: CPU seconds per phase (GC off while it runs); raises
    :class:`ReplayMismatch` unless every plan and the batch are the live run's."""
    clock = Clock()
    gc.collect()
    gc.disable()
    try:
        state = replay_search(cap, clock)
        batch = replay_prepare(cap, state.trees, clock)
    finally:
        gc.enable()
    if batch_digest(batch) != cap.batch_digest:
        raise ReplayMismatch("the replayed batch differs from the live run's")
    return clock


def summary(cap: Capture, clocks: list[Clock]) -> dict[str, Any]:
    """Per phase, the least CPU over the runs (ms per transition and ms), and the
    groups: search (everything before prepare), barrier (what the server waits for:
    all but the tail and prepare), prepare."""
    runs = [c.cpu for c in clocks]
    names = sorted({k for r in runs for k in r})
    best = {k: min(r.get(k, 0.0) for r in runs) for k in names}
    groups = {
        "search": [k for k in names if not k.startswith("prepare.")],
        "barrier": [k for k in names if not k.startswith("prepare.") and not k.endswith("tail")],
        "prepare": [k for k in names if k.startswith("prepare.")],
    }
    per_t = 1000.0 / max(1, cap.transitions)
    out = {
        "source": cap.source,
        "transitions": cap.transitions,
        "tasks": len(pickle.loads(cap.roots).trees),
        "waves": len(cap.landed),
        "runs": len(runs),
        "plans": clocks[0].count,
        "ms": {k: round(1000 * v, 2) for k, v in best.items()},
        "ms_per_transition": {k: round(v * per_t, 5) for k, v in best.items()},
    }
    for g, keys in groups.items():
        out[f"{g}_ms_per_transition"] = round(min(sum(r.get(k, 0.0) for k in keys) for r in runs) * per_t, 5)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--source", choices=("synthetic", "scale"), default="synthetic")
    ap.add_argument("--transitions", type=int, default=10000)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--wave-size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=1, help="replays; each phase reports its least CPU")
    ap.add_argument("--save", type=Path, help="keep the capture here (to replay it with other code)")
    ap.add_argument("--load", type=Path, help="replay this capture instead of capturing")
    ap.add_argument("--json", type=Path, help="write the summary here")
    args = ap.parse_args(argv)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 100000))  # deep trees pickle recursively
    pa.array([0])  # Arrow's first array imports pandas: paid before any clock
    if args.load:
        cap = pickle.loads(args.load.read_bytes())
    else:
        cap = capture(args.source, args.transitions, args.tasks, args.wave_size)
        if args.save:
            args.save.write_bytes(pickle.dumps(cap))
    runs = [replay(cap) for _ in range(args.repeats)]
    out = summary(cap, runs)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    # run as the importable module, so a saved capture names benchmarks.replay's classes
    from benchmarks.replay import main as _main

    _main()
