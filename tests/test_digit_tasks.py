"""focus.digit_tasks: the learning benchmark's tasks reward what their rules say."""

from __future__ import annotations

import asyncio

import pytest

from focus.digit_tasks import Bridge, Corridor, bridge_tasks, corridor_tasks, long_reach_tasks
from focus.env import Action, Task


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


def _inside(rng):
    return rng[0]


def _outside(rng):
    return next(d for d in range(1, 10) if not rng[0] <= d <= rng[1])


@pytest.mark.parametrize("gate", ["early", "late"])
def test_a_cued_corridor_passes_its_gate_on_a_digit_in_the_range_named_there(gate):
    task = corridor_tasks(1, seed=4, gate=gate, width=3)[0]
    length, g, ranges = task.data["length"], task.data["gate"], task.data["ranges"]
    assert len(ranges) == length and all(r in ([1, 3], [4, 6]) for r in ranges)  # blocks=2: 7-9 never named
    good = [_outside(r) for r in ranges]  # out of range everywhere but at the gate: nothing else is checked
    good[g - 1] = _inside(ranges[g - 1])
    rewards, dones = play(Corridor(), task, good)
    assert rewards == [0.0] * (length - 1) + [1.0] and dones[-1] and not any(dones[:-1])
    bad = [_inside(r) for r in ranges]
    bad[g - 1] = _outside(ranges[g - 1])
    rewards, dones = play(Corridor(), task, bad)
    assert rewards == [0.0] * length and dones[-1]
    # the constant rule's digit does not pass a gate whose named range excludes it
    mid = Task("c", {"length": 2, "gate": 2, "ranges": [[1, 3], [4, 6]]})
    assert play(Corridor(), mid, [2, 2])[0] == [0.0, 0.0] and play(Corridor(), mid, [9, 5])[0] == [0.0, 1.0]


def test_a_cued_step_names_its_range_and_an_uncued_one_does_not():
    async def texts(env, task, digits):
        reset = await env.reset(task, None)
        out, state = [reset.messages[0].content], reset.state
        for d in digits:
            r = await env.step(state, Action("text", text=str(d)), None)
            out.append(r.observation)
            state = r.state
        return out

    cued = Task("c", {"length": 3, "gate": 3, "ranges": [[2, 4], [5, 7], [1, 3]]})
    assert asyncio.run(texts(Corridor(), cued, [2, 5, 1])) == [
        "Corridor of 3. Step 1: 2-4.",
        "Step 2: 5-7.",
        "Step 3: 1-3.",
        "End.",
    ]
    plain = Task("p", {"length": 2, "gate": 2})
    assert asyncio.run(texts(Corridor(), plain, [2, 2])) == ["Corridor of 2. Step 1.", "Step 2.", "End."]
    bridge = Task("b", {"length": 2, "ranges": [[4, 4], [1, 3]]})
    assert asyncio.run(texts(Bridge(), bridge, [7, 4])) == [
        "Bridge of 2. Plank 1: not 4.",
        "Plank 2: not 1-3.",
        "Across.",
    ]


def test_a_cued_bridge_breaks_on_the_digit_its_plank_names_and_on_8_and_9():
    task = bridge_tasks(1, seed=2, width=1)[0]
    ranges = task.data["ranges"]
    assert len(ranges) == task.data["length"] and all(lo == hi and 1 <= lo <= 7 for lo, hi in ranges)
    safe = [next(d for d in range(1, 8) if d != lo) for lo, _ in ranges]
    rewards, dones = play(Bridge(), task, safe)
    assert rewards == [0.0] * (len(ranges) - 1) + [1.0] and dones[-1]
    rewards, dones = play(Bridge(), task, [safe[0], ranges[1][0]] + safe[2:])
    assert rewards == [0.0, 0.0] and dones == [False, True]  # the second plank broke: over mid-way
    for high in (8, 9):  # 8 and 9 break a cued plank too, whatever it names
        assert play(Bridge(), task, [safe[0], high] + safe[2:]) == ([0.0, 0.0], [False, True])
    low = Task("b", {"length": 2, "ranges": [[1, 3], [1, 3]]})
    assert play(Bridge(), low, [7, 4])[0] == [0.0, 1.0] and play(Bridge(), low, [2])[0] == [0.0]


def test_cued_task_sets_are_seeded_and_leave_the_constant_rule_sets_as_they_were():
    assert corridor_tasks(5, 2, width=3) == corridor_tasks(5, 2, width=3) != corridor_tasks(5, 3, width=3)
    assert bridge_tasks(5, 2, width=1) == bridge_tasks(5, 2, width=1) != bridge_tasks(5, 3, width=1)
    assert all("ranges" not in t.data for t in corridor_tasks(5, 2) + bridge_tasks(5, 2))  # width None: not cued
    assert corridor_tasks(2, 0, gate="early", width=3)[0].id == "corridor-early-w3-0-0"
    # the first `blocks` disjoint blocks, each drawn
    named = {tuple(r) for t in bridge_tasks(100, 0, width=3, blocks=3) for r in t.data["ranges"]}
    assert named == {(1, 3), (4, 6), (7, 9)}
    singles = {tuple(r) for t in bridge_tasks(100, 0, width=1) for r in t.data["ranges"]}
    assert singles == {(d, d) for d in range(1, 8)}
    for width, blocks in ((4, 3), (3, 1), (0, 2)):  # past 9, a single block (no cue to read), no digits
        with pytest.raises(ValueError, match="width"):
            corridor_tasks(1, width=width, blocks=blocks)


@pytest.mark.parametrize(
    "ranges", [[[1, 3]], [[1, 3], [4]], [[0, 3], [1, 2]], [[3, 1], [1, 2]], "1-3", [[1, True], [1, 2]]]
)
def test_a_cued_task_with_bad_ranges_is_refused_naming_them(ranges):
    with pytest.raises(ValueError, match="range"):
        asyncio.run(Corridor().reset(Task("x", {"length": 2, "gate": 2, "ranges": ranges}), None))
