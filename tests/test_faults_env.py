"""Env code that raises, hangs past its timeout or returns the wrong type, mid-rollout.

The toy task runs on the real tiny model server; one task's env breaks from its second
step on. Its rollouts end in failed leaves whose cause names the break; what they did
before the break (the first segment, up to its checkpoint) stays; the other tasks'
trees are exactly those of a clean run; statistics count each failure by cause.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.env import Env, StepResult
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import SamplingParams
from focus.priority import Phase, Selective
from focus.toy import ReachTarget, reach_target_tasks, toy_format

pytestmark = pytest.mark.timeout(90)

TASKS = reach_target_tasks(3, seed=5)  # targets 14, 9, 10: the broken task needs several steps
BROKEN_TARGET = TASKS[0].data["target"]
TIMEOUT_S = 0.3


class BreaksLater(Env):
    """ReachTarget, except that the task with ``BROKEN_TARGET`` breaks at its second step."""

    def __init__(self, mode: str | None) -> None:
        self.inner, self.mode = ReachTarget(), mode

    async def reset(self, task, workspace):
        return await self.inner.reset(task, workspace)

    async def step(self, state, action, workspace):
        result = await self.inner.step(state, action, workspace)
        if self.mode is None or state.target != BROKEN_TARGET or state.turns < 1:
            return result
        if self.mode == "raise":
            raise ConnectionError("sandbox went away")
        if self.mode == "hang":
            await asyncio.sleep(60)
        if self.mode == "wrong_type":
            return {"observation": "Total 3."}
        if self.mode == "bad_observation":
            return replace(result, observation=None)
        if self.mode == "bad_reward":
            return replace(result, reward="high")
        if self.mode == "bad_done":
            return replace(result, done="yes")
        return StepResult(state, "", 0.0, False)


CAUSES = {
    "raise": "env: ConnectionError: sandbox went away",
    "hang": f"env: step timed out after {TIMEOUT_S:g} s",
    "wrong_type": "env: BreaksLater.step returned dict, expected StepResult",
    "bad_observation": "observation of type NoneType, expected str",
    "bad_reward": "non-numeric reward 'high'",
    "bad_done": "done='yes', expected a bool",
}


def collect(url: str, mode: str | None):
    policy = OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size, config=HttpConfig(max_retries=1))
    agent = Agent(
        policy,
        BreaksLater(mode),
        toy_format(),
        max_steps=6,
        sampling=SamplingParams(max_tokens=8),
        env_timeout_s=TIMEOUT_S,
    )
    col = Collector(
        agent,
        search=Selective(phases=[Phase("evidence", rollouts_per_task=3)]),
        critic=ConstantCritic(0.5),
        execution=Execution(max_concurrency=9),
        collection_id="env-faults",
        seed=4,
    )

    async def go():
        try:
            return await col.search(TASKS)
        finally:
            await policy.aclose()

    state = asyncio.run(go())
    return state, col.prepare(state)


@pytest.fixture(scope="module")
def clean(local_model_server):
    return collect(local_model_server.url, None)


def rows(batch, task_ids):
    """The healthy trees' rows: what was sampled, where. (Not their advantages: the
    critic's weight is fitted on the whole collection's residuals, so the broken tree's
    missing evidence may move every tree's advantages a little, by design.)"""
    return [
        (r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, r.logprobs)
        for r in batch.actor
        if r.task_id in task_ids
    ]


@pytest.mark.parametrize("mode", list(CAUSES))
def test_env_failures_fail_only_their_rollouts_and_are_counted(local_model_server, clean, mode):
    clean_state, clean_batch = clean
    state, batch = collect(local_model_server.url, mode)
    broken, *healthy = state.trees
    # the broken task: every rollout that got past its first step failed, with the cause
    long = [r for r in clean_state.trees[0].log if r.usage.transitions > 1]
    assert long, "the clean run must have rollouts longer than one step for this test to bite"
    failed = [r for r in broken.log if r.failed]
    assert len(failed) == len(long) and all(CAUSES[mode] in r.cause for r in failed)
    assert batch.stats["failed_rollouts"] == len(failed)
    assert sum(batch.stats["failure_causes"].values()) == len(failed)
    # the step before the break is kept: each failed rollout's first segment has rows
    first_edges = {e.id for e in broken.child_edges(broken.ROOT)}
    assert first_edges <= {r.edge_id for r in batch.actor if r.task_id == broken.task_id}
    # nothing else changed: the healthy trees are those of the clean run, row for row
    ids = {t.task_id for t in healthy}
    assert rows(batch, ids) == rows(clean_batch, ids) and rows(batch, ids)
    assert all(not any(r.failed for r in t.log) for t in healthy)
