"""Streaming continuation phases: the refill planner (pure) and the collector loop that
keeps ``max_concurrency`` rollouts in flight, on synthetic tasks and, over real HTTP,
on the simulated model server of benchmarks/engine.py."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from focus.agent import Agent
from focus.collector import Collector
from focus.env import Task
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.priority import Phase, Selective
from focus.search import InFlight, plan_refill, plan_wave, rollout_seed
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.testing import run

BUDGET, CAP, MAX_BRANCHES, MAX_STEPS = 80, 6, 3, 20
PHASES = (
    Phase("evidence", rollouts_per_task=2),
    Phase("continue", transitions=BUDGET, wave_size=64, max_branches=MAX_BRANCHES, max_depth=8),
)


class _Jittery(SyntheticPolicy):
    """Answers after a seeded random pause, so rollouts finish out of launch order."""

    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        await asyncio.sleep(random.Random(params.seed).uniform(0.0, 0.004))
        return await super().sample(prompt_ids, params)


def synthetic(
    *, streaming: bool, seed: int = 0, cap: int = CAP, phases=PHASES, graft: float = 1.0
) -> tuple[Collector, list]:  # type: ignore[no-untyped-def]
    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long", "critical"])]
    agent = Agent(_Jittery(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=MAX_STEPS)
    col = Collector(
        agent,
        Selective(phases=phases),
        SyntheticCritic(mdps, 0.1),
        DirectBranchTd(),
        Execution(max_concurrency=cap, streaming=streaming, graft_fraction=graft),
        collection_id="s",
        seed=seed,
    )
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(len(mdps))]


# -- the planner -------------------------------------------------------------------------


def test_refill_without_jobs_in_flight_plans_what_a_wave_would():
    col, tasks = synthetic(streaming=False)
    state = run(col.run_evidence(tasks))
    wave = plan_wave(state, col.priority, 1, 0)
    refill = plan_refill(state, col.priority, 1, (), slots=10**6)
    assert [f.job for f in refill] == list(wave.jobs) and wave.jobs
    assert [f.job for f in plan_refill(state, col.priority, 1, (), slots=5)] == list(wave.jobs[:5])
    assert plan_refill(state, col.priority, 1, (), slots=0) == ()
    with pytest.raises(ValueError, match="evidence phase"):
        plan_refill(state, col.priority, 0, (), slots=4)


def test_jobs_in_flight_count_toward_branch_limits_budget_and_branch_indices():
    # seed 5: a collection whose first planned checkpoint is planned again with its
    # first continuation in flight (at seeds 0-4 the next plan goes elsewhere)
    col, tasks = synthetic(streaming=False, seed=5)
    search = col.priority
    state = run(col.run_evidence(tasks))
    first = plan_refill(state, search, 1, (), slots=1)
    (f,) = first
    ti, nid = f.job.tree_index, f.job.node_id
    # the same checkpoint, with its first continuation in flight: next branch index and seed
    more = plan_refill(state, search, 1, first, slots=10**6)
    again = [g.job for g in more if (g.job.tree_index, g.job.node_id) == (ti, nid)]
    done = _branches(state, ti, nid)
    assert again and [j.branch for j in again] == list(range(done + 1, done + 1 + len(again)))
    assert all(j.seed == rollout_seed(state.seed, ti, nid, j.branch) for j in again)
    # never more continuations per checkpoint than max_branches, in flight included
    started = Counter((g.job.tree_index, g.job.node_id) for g in (*first, *more))
    for (t, n), k in started.items():
        assert k + _branches(state, t, n) <= MAX_BRANCHES
    # a checkpoint whose remaining branches are all in flight is not planned again
    full = tuple(InFlight(f.job, 0.0) for _ in range(MAX_BRANCHES - _branches(state, ti, nid)))
    assert all((g.job.tree_index, g.job.node_id) != (ti, nid) for g in plan_refill(state, search, 1, full, 10**6))
    # expected transitions in flight are held back from the budget
    assert plan_refill(state, search, 1, (InFlight(f.job, float(BUDGET)),), slots=10**6) == ()
    part = plan_refill(state, search, 1, (InFlight(f.job, BUDGET - 10.0),), slots=10**6)
    assert part and sum(g.expected_transitions for g in part[:-1]) < 10 <= sum(g.expected_transitions for g in part)


def _branches(state, ti: int, nid: int) -> int:  # type: ignore[no-untyped-def]
    """Continuations started from a checkpoint: its children (the rollout that made it
    goes on below it, so a checkpoint has one before any continuation)."""
    return len(state.trees[ti].nodes[nid].children)


# -- the collector loop on synthetic tasks ---------------------------------------------


@pytest.mark.parametrize("graft", [0.2, 1.0, 3.0])
def test_streaming_collection_respects_budget_and_branch_limits_and_gives_a_valid_batch(graft: float):
    """Grafting after every finished rollout, after a cap's worth, and after three: the
    rollouts finished but not grafted count toward limits and budget like running ones."""
    col, tasks = synthetic(streaming=True, graft=graft)
    state = run(col.search(tasks))
    batch = col.prepare(state)
    ev, cont = batch.stats["phases"]
    assert ev["rollouts"] == 2 * len(tasks) and ev["waves"] == 1
    # launching stops once grafted + expected in-flight transitions cover the budget;
    # at most CAP rollouts were running then, each at most MAX_STEPS transitions
    assert BUDGET <= cont["transitions"] < BUDGET + CAP * MAX_STEPS
    assert batch.stats["transitions"] == sum(t.stats()["transitions"] for t in state.trees)
    assert cont["waves"] >= 2 and cont["wall_s"] > 0
    for ti, t in enumerate(state.trees):
        for nid in {r.node for r in t.log if r.phase == 1}:
            assert _branches(state, ti, nid) <= MAX_BRANCHES
            branches = sorted(r.branch for r in t.log if r.node == nid)
            first = 0 if nid == t.ROOT else 1  # branch 0 of an inner checkpoint is the rollout that made it
            assert branches == list(range(first, first + len(branches)))  # every branch index once
        for r in t.log:
            assert r.seed == rollout_seed(state.seed, ti, r.node, r.branch)
    n_turns = sum(len(e.turns) for t in state.trees for e in t.edges.values())
    assert len(batch.actor) == n_turns - sum(
        len(e.turns) for t in state.trees for e in t.edges.values() if t.nodes[e.child].kind == "failed"
    )
    assert batch.critic and all(r.target == r.target for r in batch.critic)


def test_each_streamed_rollout_is_reproducible_from_its_job():
    """Completion order changes which jobs are planned, not what a job produces: rerun
    every streamed job from its checkpoint's branch state and seed, alone."""
    col, tasks = synthetic(streaming=True, seed=3)
    state = run(col.search(tasks))
    records = [(ti, r) for ti, t in enumerate(state.trees) for r in t.log if r.phase == 1]
    assert records

    async def replay():  # type: ignore[no-untyped-def]
        return [await col.agent.rollout(state.trees[ti].states[r.node], r.seed) for ti, r in records]

    for (_, r), ro in zip(records, run(replay()), strict=True):
        turns = ro.turns
        assert (r.leaf, r.usage.tokens, r.usage.transitions) == (
            ro.leaf.kind,
            sum(len(t.completion_ids) for t in turns),
            sum(1 for t in turns if t.transition),
        )


def test_streaming_mode_refuses_what_it_cannot_honour():
    from focus.dask_execution import DaskExecution

    with pytest.raises(ValueError, match="overrides run"):
        DaskExecution(n_workers=1, streaming=True)
    phases = (PHASES[0], Phase("continue", transitions=10, max_waves=2))
    col, tasks = synthetic(streaming=True, phases=phases)
    with pytest.raises(ValueError, match="max_waves"):
        run(col.search(tasks))


class _Crashing(Execution):
    supports_streaming = True

    def launch(self, agent, job):  # type: ignore[no-untyped-def]
        if job.seed % 3 == 0:

            class Broken:
                async def rollout(self, start, seed):  # type: ignore[no-untyped-def]
                    raise RuntimeError("kaboom")

            return super().launch(Broken(), job)  # type: ignore[arg-type]
        return super().launch(agent, job)


def test_a_crashing_streamed_job_becomes_a_failed_rollout():
    col, tasks = synthetic(streaming=True)
    col.execution = _Crashing(max_concurrency=CAP, streaming=True)
    batch = run(col.collect(tasks))
    assert batch.stats["failure_causes"] == {"error: RuntimeError: kaboom": batch.stats["failed_rollouts"]}
    assert batch.stats["phases"][1]["rollouts"] > batch.stats["failed_rollouts"] > 0


# -- real HTTP: the simulated model server ------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.integration
def test_streaming_over_http_reaches_the_slot_cap_and_records_every_turn():
    """At a slot-bound server, a streamed continuation phase reaches the server's slot
    cap, spends the phase's budget without failures and records every turn's log-probs,
    as waves do. How busy each mode keeps the server is a figure of the machine's speed
    (a loaded machine starves the client, not the server): ``benchmarks/engine.py``
    measures it (``slot_utilisation_continuation``), not this test."""
    from benchmarks import engine
    from focus.testing.simserver import SimConfig, SimServerProcess
    from focus.toy import reach_target_tasks

    slots, latency = 8, 0.05
    tasks = reach_target_tasks(16, seed=1, low=20, high=40)
    with SimServerProcess(SimConfig(slots=slots, latency_s=latency, completion_tokens=3)) as server:
        for streaming in (False, True):
            agent = engine.make_agent(server.url, 4 * slots)
            col = engine.make_collector(
                agent,
                Execution(max_concurrency=2 * slots, streaming=streaming),
                transitions=400,
                wave_size=48,
                seed=0,
            )
            state = run(col.run_evidence(tasks))  # the evidence wave drains in both modes: not measured

            async def phase(state=state, col=col, streaming=streaming):  # type: ignore[no-untyped-def]
                try:
                    if streaming:
                        return await col.stream_phase(state, 1)
                    wave = 0
                    while not (plan := col.plan_wave(state, 1, wave)).empty:
                        state = await col.run_wave(state, plan)
                        wave += 1
                    return state
                finally:
                    await col.agent.policy.aclose()

            state = run(phase())
            after = server.stats()
            usage = state.usage(1)
            assert 400 <= usage.transitions < 400 + 2 * slots * 16 and usage.failed_rollouts == 0
            assert after["max_in_flight"] == slots
            batch = col.prepare(state)
            assert batch.actor and all(r.logprobs and len(r.logprobs) == len(r.completion_ids) for r in batch.actor)
