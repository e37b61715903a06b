"""A continuation wave started as it is chosen (:func:`focus.waves.launch_choosing`):
the plan a slice at a time is :func:`focus.search.plan_next`'s, and a collection whose
waves start one job at a time gives the pinned batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import focus.waves
from focus.agent import BranchState, Piece, Rollout
from focus.env import Task
from focus.execution import Execution, JobFeed
from focus.search import RolloutJob, plan_begin, plan_choose, plan_chosen, plan_next
from focus.testing import run
from tests.test_search_planning import PINNED, collection, digest, jobs


def test_a_wave_chosen_a_slice_at_a_time_is_plan_nexts() -> None:
    col, tasks = collection("selective", 0)
    state = run(col.run_evidence(tasks))
    assert plan_begin(state, col.priority, 0) is None  # the evidence: planned whole
    waves = 0
    while True:
        want = plan_next(state, col.priority, 1)
        choice = plan_begin(state, col.priority, 1)
        assert choice is not None
        got: list = []  # type: ignore[type-arg]
        while not choice.done:
            got.extend(plan_choose(choice, 3))
        chosen = plan_chosen(choice)
        if want is state:
            assert chosen is state and not got
            break
        plan = chosen.planned[-1]
        assert jobs(plan) == jobs(want.planned[-1]) and plan.expected == want.planned[-1].expected
        assert list(plan.jobs) == got
        assert plan_begin(chosen, col.priority, 1) is None  # waves_in_flight planned
        state = run(col.run_wave(state, plan))
        waves += 1
    assert waves >= 3


@pytest.mark.parametrize("kind", ["selective", "uniform"])
def test_waves_started_one_job_at_a_time_give_the_pinned_batch(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(focus.waves, "CHOOSE_SLICE", 1)
    col, tasks = collection(kind, 0)
    batch = run(col.collect(tasks))
    assert (digest(batch), len(batch.actor), len(batch.critic)) == PINNED[(kind, 0)]


def test_a_feed_runs_its_jobs_as_they_come_and_returns_them_in_plan_order() -> None:
    col, tasks = collection("selective", 0)
    state = run(col.run_evidence(tasks))
    plan = plan_next(state, col.priority, 1).planned[-1]
    assert len(plan.jobs) >= 3

    async def go() -> tuple[list, list, list]:  # type: ignore[type-arg]
        feed = JobFeed(plan.jobs[:2])
        done: list[int] = []
        task = asyncio.ensure_future(
            Execution(max_concurrency=4).run_reporting(col.agent, feed, lambda i, r: done.append(i))
        )
        for _ in range(20):  # the first jobs finish before the rest is handed over
            await asyncio.sleep(0.001)
        first = list(done)
        feed.add(plan.jobs[2:])
        feed.close()
        return first, await task, done

    first, fed, done = run(go())
    whole = run(Execution(max_concurrency=4).run(col.agent, list(plan.jobs)))
    assert sorted(first) == [0, 1]
    assert sorted(done) == list(range(len(plan.jobs)))
    assert [r.pieces for r in fed] == [r.pieces for r in whole]
    with pytest.raises(ValueError, match="closed"):
        JobFeed((), closed=True).add(plan.jobs[:1])


class _Instant:
    """An agent whose rollouts take two turns of the event loop and make no futures."""

    def __init__(self) -> None:
        self.runs: list[int] = []

    async def rollout(self, start: BranchState, seed: int) -> Rollout:
        self.runs.append(seed)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return Rollout(start.task.id, (Piece((), "terminal", start.steps + 1, ()),), 0.0, {})


def test_jobs_handed_over_wake_as_many_idle_workers_as_there_are_jobs() -> None:
    """Workers that ran out of a feed's jobs wait; a slice handed over wakes as many of
    them as it has jobs, not every one (at 512 in flight, waking all of them at each
    slice made a future and a task step more for every two transitions at 10k
    transitions over 40 tasks: benchmarks/README.md, scale). Counted as the futures the
    event loop makes: each wait is one."""
    start = BranchState(Task("t", {}), None, None, None, steps=1)
    jobs = [RolloutJob(i % 3, 0, i, start) for i in range(12)]
    agent = _Instant()

    async def go() -> tuple[list[int], list[Rollout]]:
        loop = asyncio.get_running_loop()
        made = [0]
        create = loop.create_future

        def counted() -> asyncio.Future[Any]:
            made[0] += 1
            return create()

        loop.create_future = counted  # type: ignore[method-assign]
        feed = JobFeed(jobs[:8])
        task = asyncio.ensure_future(Execution(max_concurrency=8).run_reporting(agent, feed, lambda i, r: None))

        async def settle() -> int:
            before = made[0]
            for _ in range(10):
                await asyncio.sleep(0)
            return made[0] - before

        waits = [await settle()]  # 8 workers ran a job each and wait
        for n in (1, 3):
            feed.add(jobs[len(feed.jobs) : len(feed.jobs) + n])
            waits.append(await settle())
        feed.close()
        out = await task
        return waits, out

    waits, out = run(go())
    assert waits == [8, 1, 3]  # every worker once; then only those woken for a job wait again
    assert sorted(agent.runs) == list(range(12))  # each job run once
    assert [r.leaf.steps for r in out] == [2] * 12 and len(out) == 12
