"""focus.digit_tasks: the learning benchmark's tasks reward what their rules say."""

from __future__ import annotations

import asyncio

import pytest

from focus.digit_tasks import Bridge, Corridor, bridge_tasks, corridor_tasks, long_reach_tasks
from focus.env import Action


def play(env, task, digits):
    """Step ``env`` through ``digits``; (rewards, done flags) of the steps taken."""

    async def go():
        reset = await env.reset(task, None)
        state, rewards, dones = reset.state, [], []
        for d in digits:
            r = await env.step(state, Action("text", text=str(d)), None)
            state = r.state
            rewards.append(r.reward)
            dones.append(r.done)
            if r.done:
                break
        return rewards, dones

    return asyncio.run(go())


@pytest.mark.parametrize("gate", ["early", "late"])
def test_a_corridor_rewards_a_low_digit_at_its_gate_only_at_the_end(gate):
    task = corridor_tasks(1, seed=3, gate=gate)[0]
    length, g = task.data["length"], task.data["gate"]
    assert g == (1 if gate == "early" else length)
    good = [9] * length
    good[g - 1] = 2  # the optimal policy: a low digit at the gate, anything elsewhere
    rewards, dones = play(Corridor(), task, good)
    assert rewards == [0.0] * (length - 1) + [1.0] and dones[-1] and not any(dones[:-1])
    bad = [2] * length
    bad[g - 1] = 7  # a high digit at the gate: the walk goes on, and pays nothing
    rewards, dones = play(Corridor(), task, bad)
    assert rewards == [0.0] * length and len(dones) == length and dones[-1]


def test_a_bridge_ends_at_a_broken_plank_and_pays_at_the_far_side():
    task = bridge_tasks(1, seed=1)[0]
    length = task.data["length"]
    rewards, dones = play(Bridge(), task, [1] * length)
    assert rewards[-1] == 1.0 and len(rewards) == length and dones[-1]
    rewards, dones = play(Bridge(), task, [3, 9, 1, 1, 1, 1, 1])
    assert rewards == [0.0, 0.0] and dones == [False, True]  # the second plank broke: over mid-way


def test_invalid_replies_and_bad_tasks():
    task = bridge_tasks(1)[0]

    async def invalid():
        reset = await Bridge().reset(task, None)
        return await Bridge().step(reset.state, Action("text", text="no digit"), None)

    r = asyncio.run(invalid())
    assert not r.done and r.reward == 0.0 and r.info == {"invalid_action": 1}
    from focus.env import Task

    with pytest.raises(ValueError, match="gate"):
        asyncio.run(Corridor().reset(Task("x", {"length": 3, "gate": 4}), None))
    with pytest.raises(ValueError, match="early"):
        corridor_tasks(1, gate="middle")


def test_task_sets_are_seeded_and_long_reach_has_far_targets():
    assert corridor_tasks(5, 2) == corridor_tasks(5, 2) != corridor_tasks(5, 3)
    targets = [t.data["target"] for t in long_reach_tasks(50, 0)]
    assert min(targets) >= 20 and max(targets) <= 35
    assert all(4 <= t.data["length"] <= 6 for t in bridge_tasks(30, 0))
