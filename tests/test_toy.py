"""The ReachTarget toy task, and the committed initial weights playing it over HTTP."""

from __future__ import annotations

import asyncio
import random

import pytest

from focus.agent import Agent
from focus.branching import EveryDecision
from focus.env import Action, Task
from focus.format import ParseError
from focus.policy import SamplingParams
from focus.testing import EnvConformance, run
from focus.toy import (
    FirstDigitParser,
    ReachState,
    ReachTarget,
    reach_target_tasks,
    success_probability_uniform,
    toy_format,
)


class TestReachTargetConformance(EnvConformance):
    def make_env(self):
        return ReachTarget()

    def make_task(self):
        return Task("t", {"target": 7})

    def make_action(self):
        return Action("text", text="3")


def step(env, state, text):
    return run(env.step(state, Action("text", text=text), None))


def test_episode_rewards_exact_landing_only():
    env = ReachTarget()
    reset = run(env.reset(Task("t", {"target": 10}), None))
    assert reset.messages[0].content == "Reach 10. Total 0."
    r1 = step(env, reset.state, "4")
    assert (r1.state, r1.observation, r1.reward, r1.done) == (ReachState(10, 4, 1), "Total 4.", 0.0, False)
    hit = step(env, r1.state, "6")
    assert hit.done and hit.reward == 1.0
    over = step(env, r1.state, "9")
    assert over.done and over.reward == 0.0 and over.observation == "Total 13."
    bad = step(env, r1.state, "x")
    assert bad.state == r1.state and not bad.done and bad.info == {"invalid_action": 1}


def test_parser_takes_first_digit_else_parse_error():
    p = FirstDigitParser()
    assert p.parse("I pick 7 then 3") == Action("text", text="7")
    assert p.parse("0 or 5") == Action("text", text="5")
    assert isinstance(p.parse("none"), ParseError)
    assert toy_format().codec.vocab_size == 263


def test_tasks_are_deterministic_and_in_range():
    a, b = reach_target_tasks(50, seed=3), reach_target_tasks(50, seed=3)
    assert a == b != reach_target_tasks(50, seed=4)
    assert all(5 <= t.data["target"] <= 15 for t in a) and len({t.id for t in a}) == 50
    with pytest.raises(ValueError, match="needs an integer 'target'"):
        run(ReachTarget().reset(Task("t", {"target": "7"}), None))
    with pytest.raises(ValueError):
        reach_target_tasks(3, low=9, high=2)


def test_uniform_success_probability_matches_simulation():
    rng = random.Random(0)
    for target in (5, 12):
        hits = 0
        for _ in range(20000):
            total = 0
            while total < target:
                total += rng.randint(1, 9)
            hits += total == target
        assert hits / 20000 == pytest.approx(success_probability_uniform(target), abs=0.01)


def test_initial_weights_play_valid_moves_and_succeed_sometimes(local_model_server):
    """The committed weights: valid format nearly always, success near the random baseline."""
    policy = local_model_server.policy()
    agent = Agent(
        policy,
        ReachTarget(),
        toy_format(),
        branch_points=EveryDecision(),
        max_steps=20,
        sampling=SamplingParams(max_tokens=8),
    )
    tasks = reach_target_tasks(60, seed=1)

    async def go():
        try:
            starts = [(await agent.start(t), i) for i, t in enumerate(tasks)]
            return await asyncio.gather(*(agent.rollout(s, seed) for s, seed in starts))
        finally:
            await policy.aclose()

    rollouts = run(go())
    turns = [t for r in rollouts for t in r.turns]
    valid = sum(
        len(t.completion_ids) == 2 and t.completion_ids[1] == 257 and 49 <= t.completion_ids[0] <= 57 for t in turns
    )
    success = sum(r.leaf.kind == "terminal" and r.turns[-1].reward == 1.0 for r in rollouts) / len(rollouts)
    baseline = sum(success_probability_uniform(t.data["target"]) for t in tasks) / len(tasks)
    assert valid / len(turns) > 0.95
    assert all(r.leaf.kind == "terminal" for r in rollouts)
    assert 0.05 < success < 0.5 and abs(success - baseline) < 0.15, (success, baseline)
    # a parse error is a turn without a task transition; every valid move is a transition
    assert all(t.loss_mask == 1 for t in turns) and sum(t.transition for t in turns) >= valid
