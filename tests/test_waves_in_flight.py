"""Waves planned ahead (``waves_in_flight`` > 1): the next wave launches while the
previous one still runs, yet every plan is a pure function of the grafted rollouts.

So a collection is the same whatever order its rollouts finish in, a replay of its
stored waves rebuilds the live state (planned waves included), and the pipeline resumes
it exactly from any checkpoint, with waves still running when it stopped.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from fixtures.journal import StopAfter, Stopped, run_collect
from test_pipeline import direct_batch, rows, small_config

from focus.agent import Agent
from focus.collector import Collector, Running
from focus.env import Task
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.journal import wave_step
from focus.priority import Phase, Selective
from focus.search import WaveRecord, graft, plan_ahead, plan_wave, replay
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.testing import run
from storage import BatchStore
from tasks.journal import CheckpointJournal

PHASES = (
    Phase("evidence", rollouts_per_task=2),
    # waves of one half rollout's worth of transitions: several waves from a small budget
    Phase("continue", transitions=90, wave_size=1, max_branches=3, max_depth=8),
    Phase("more", transitions=30, wave_size=1, max_branches=4),
)


class Jittery(SyntheticPolicy):
    """Answers after a random pause (not seeded): rollouts finish in a different order
    every run, as they do against a real service."""

    def __init__(self, mdps, spread_s: float) -> None:  # type: ignore[no-untyped-def]
        super().__init__(mdps)
        self.spread_s = spread_s

    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        await asyncio.sleep(random.uniform(0.0, self.spread_s))
        return await super().sample(prompt_ids, params)


def collector(ahead: int, *, spread_s: float = 0.0, concurrency: int = 4) -> tuple[Collector, list[Task]]:
    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long", "critical"])]
    policy = Jittery(mdps, spread_s) if spread_s else SyntheticPolicy(mdps)
    agent = Agent(policy, SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    col = Collector(
        agent,
        Selective(phases=PHASES, waves_in_flight=ahead),
        SyntheticCritic(mdps, 0.1),
        DirectBranchTd(),
        Execution(max_concurrency=concurrency),
        collection_id="ahead",
        seed=5,
    )
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(len(mdps))]


def key(batch):  # type: ignore[no-untyped-def]
    return [(r.tree_id, r.edge_id, r.turn_index, r.completion_ids, round(r.advantage, 12)) for r in batch.actor], [
        (r.tree_id, r.node_id, round(r.target, 12), r.weight) for r in batch.critic
    ]


def test_a_wave_planned_ahead_counts_the_running_ones_as_pending():
    col, tasks = collector(3)
    search = col.priority
    state = run(col.run_evidence(tasks))
    ahead = plan_ahead(state, search, 1)
    assert [p.wave_index for p in ahead.planned] == [0, 1, 2] and ahead.trees is state.trees
    first = ahead.planned[0]
    assert first.jobs == plan_wave(state, search, 1, 0).jobs  # the oldest is what a barrier would plan
    jobs = [(j.tree_index, j.node_id, j.branch) for p in ahead.planned for j in p.jobs]
    assert len(jobs) == len(set(jobs))  # later waves continue branch indices, never reuse them
    per_node: dict[tuple[int, int], int] = {}
    for ti, nid, _ in jobs:
        per_node[(ti, nid)] = per_node.get((ti, nid), 0) + 1
    assert all(len(state.trees[ti].nodes[nid].children) + n <= 3 for (ti, nid), n in per_node.items())
    # the expected transitions of the running waves are held back from the budget
    expected = sum(sum(p.expected) for p in ahead.planned)
    assert expected < 90 + max(max(p.expected) for p in ahead.planned)
    assert plan_ahead(ahead, search, 1) is ahead  # full: nothing more to plan
    with pytest.raises(ValueError, match="oldest planned wave"):
        graft(ahead, ahead.planned[1], [None] * len(ahead.planned[1].jobs))  # type: ignore[list-item]
    with pytest.raises(ValueError, match="another phase"):
        plan_wave(ahead, search, 2, 0)


@pytest.mark.slow
def test_the_collection_is_the_same_whatever_order_rollouts_finish_in():
    """Random answer times reorder completions; the batch does not move (waves 1 and 3)."""
    for ahead in (1, 3):
        batches = []
        for _ in range(2):
            col, tasks = collector(ahead, spread_s=0.002)
            batches.append(col.prepare(run(col.search(tasks))))
        still, _ = collector(ahead)
        assert key(batches[0]) == key(batches[1]) == key(still.prepare(run(still.search(tasks))))
    # planning ahead plans differently from a barrier (else it would be pointless to test)
    a, tasks = collector(1)
    b, _ = collector(2)
    assert key(a.prepare(run(a.search(tasks)))) != key(b.prepare(run(b.search(tasks))))


def test_the_next_wave_runs_while_the_oldest_is_grafted_and_scored():
    col, tasks = collector(2, spread_s=0.003)
    started: list[tuple[float, int]] = []
    landed: dict[int, float] = {}
    rollout = col.agent.rollout

    async def recording(start, seed):  # type: ignore[no-untyped-def]
        started.append((time.perf_counter(), seed))
        return await rollout(start, seed)

    col.agent.rollout = recording  # type: ignore[method-assign]

    async def go():  # type: ignore[no-untyped-def]
        state = await col.run_evidence(tasks)
        running, wave_of = Running(), {}
        while True:
            state, done = await col.advance(state, 1, running)
            for plan in state.planned:
                wave_of.update({j.seed: plan.wave_index for j in plan.jobs})
            if done is None:
                return wave_of
            wave_of.update({j.seed: done.plan.wave_index for j in done.plan.jobs})
            landed[done.plan.wave_index] = time.perf_counter()
            state = await col.score(state)

    wave_of = run(go())
    # a rollout of wave w + 1 started before wave w was grafted, for most waves
    early = {w for w in landed if any(wave_of.get(s) == w + 1 and t < landed[w] for t, s in started)}
    assert len(landed) >= 4 and len(early) >= len(landed) // 2


def test_replay_rebuilds_the_live_state_with_its_planned_waves():
    col, tasks = collector(2)
    search = col.priority

    async def live():  # type: ignore[no-untyped-def]
        state = await col.run_evidence(tasks)
        start, states, records = state, [], []
        for p in (1, 2):
            running = Running()
            while True:
                state, done = await col.advance(state, p, running)
                if done is None:
                    break
                preds = await col.predict(state)
                scored = await col.score(state)
                records.append(WaveRecord(p, done.plan.wave_index, done.rollouts, done.wall_s, preds))
                states.append(scored)
                state = scored
        return start, states, records

    start, states, records = run(live())
    assert len(records) >= 6 and {r.phase_index for r in records} == {1, 2}
    for k in (1, 3, len(records)):
        again = replay(start, search, records[:k])
        want = states[k - 1]
        assert again.waves == want.waves
        assert [(p.phase_index, p.wave_index, p.jobs) for p in again.planned] == [
            (p.phase_index, p.wave_index, p.jobs) for p in want.planned
        ]
        assert col.prepare(again).actor == col.prepare(want).actor
    with pytest.raises(ValueError, match="not the next wave"):
        replay(start, search, records[1:])


@pytest.mark.parametrize("crash_after", [0, 1, 2, 4])
def test_the_pipeline_resumes_exactly_with_waves_still_running(tmp_path, crash_after):
    """The process "dies" right after wave ``crash_after`` is saved (its scores not yet,
    the waves planned after it running or landed and not saved); a fresh run of the
    same collection reuses exactly the saved waves and finishes with the batch of an
    uninterrupted collection."""
    # a budget that lasts more waves than the latest crash point
    updates = {"search.waves_in_flight": 2, "model.options": {"latency_s": 0.002}, "search.phases.1.transitions": 48}
    cfg = small_config(str(tmp_path / "store"), "ahead", **updates)
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, wave_step(1, crash_after)))

    fresh = CheckpointJournal(cfg)  # a new process: nothing in memory
    out = run_collect(cfg, fresh)
    reused = [r.reused for r in fresh.records if r.kind == "wave"]
    assert reused[: crash_after + 1] == [True] * (crash_after + 1) and not any(reused[crash_after + 1 :])
    batch = BatchStore(cfg.storage.root).read(out["batch_url"])
    assert rows(batch) == rows(direct_batch(cfg))
