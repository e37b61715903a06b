"""Trees as deep as long agentic episodes make: what walks a tree or its segments from
the root to a leaf keeps its own stack, so Python's recursion limit (1000 frames) bounds
no episode. Measured before: a collection of one 1,200-step rollout with
``EveryDecision`` (and 3,000 steps, every estimator) ran to its end and then stopped
in ``prepare`` with RecursionError (``Tree.reaches_valid_leaf``, two frames a
checkpoint: about 500 steps were enough); the local trainer's ``segment_weights=
"reach"`` recursed once per segment of a path whose segments came deepest first.

The tests lower the recursion limit to a little above the depth the test runs at, so
a walk that recurses fails on a tree of a hundred-odd levels, in a fraction of a second."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
from collections.abc import Iterator

import pytest

from focus.agent import Agent
from focus.batch import ActorRow
from focus.branching import EveryDecision
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.env import Env, Message, Reset, StepResult, Task
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.priority import Phase, Selective
from focus.testing import ScriptedPolicy
from focus.toy import toy_format
from focus.tree_weights import segment_weights

DEPTH = 150


@contextlib.contextmanager
def frames_to_spare(n: int) -> Iterator[None]:
    """The recursion limit set to the current depth plus ``n`` within the block."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + n)
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


class Steps(Env):
    """``DEPTH`` steps whatever the action; reward 1 on the last."""

    async def reset(self, task, workspace):  # type: ignore[no-untyped-def]
        return Reset(0, (Message("user", "go"),))

    async def step(self, state, action, workspace):  # type: ignore[no-untyped-def]
        return StepResult(state + 1, f"s{state + 1}", float(state + 1 == DEPTH), state + 1 == DEPTH)


def test_a_tree_deeper_than_the_frames_to_spare_is_walked_and_prepared():
    agent = Agent(ScriptedPolicy(["5"]), Steps(), toy_format(), branch_points=EveryDecision(), max_steps=DEPTH + 1)
    col = Collector(agent, Selective(phases=[Phase("e", rollouts_per_task=1)]), ConstantCritic(0.5), DirectBranchTd())
    col.execution = Execution(max_concurrency=1)
    state = asyncio.run(col.search([Task("t0")]))
    (tree,) = state.trees
    assert max(n.depth for n in tree.nodes.values()) >= DEPTH - 1
    with frames_to_spare(60):
        assert tree.reaches_valid_leaf(tree.ROOT)
        batch = col.prepare(state)
    assert batch.stats["failed_trees"] == 0 and len(batch.actor) == DEPTH


def test_reach_weights_of_a_chain_of_segments_deeper_than_the_frames_to_spare():
    rows = [
        ActorRow("c", 0, "t", "t#0", i, i, 0, "v0", tuple(range(i + 1)), (i + 1,), (-1.0,), (1,), 1.0, 0.0, "stop")
        for i in reversed(range(DEPTH))  # deepest first: each segment's parents are not weighed yet
    ]
    with frames_to_spare(60):
        weights = segment_weights(rows, "reach")
    assert len(weights) == DEPTH and weights == pytest.approx({k: 1.0 for k in weights})


def test_reach_weights_of_a_large_batch_are_found_without_comparing_every_pair():
    """Every segment's parent was looked for among every segment of the batch, each a
    prefix comparison: 9,000 segments of 300 trees took 14.7 s and one tree of 2,311
    segments 49 s (``segment_weights="reach"``, the local trainer's option); now a
    lookup per tree, longest prefix first (0.05 s and 0.15 s). 400 trees of 30 chained
    segments here, 12,000 segments: the pairs grow as their square."""
    rows = [
        ActorRow(
            "c", 0, f"t{t}", f"t{t}#0", i, i, 0, "v0", tuple(range(i + 1)), (i + 1,), (-1.0,), (1,), 1.0, 0.0, "stop"
        )
        for t in range(400)
        for i in range(30)
    ]
    weights = segment_weights(rows, "reach")  # no wall-time bound here: the figures above are measured
    assert len(weights) == 12_000 and set(weights.values()) == {1.0}


def test_reach_weights_end_where_segments_without_tokens_are_each_other_s_parent():
    """Two turns without a completion token from two checkpoints of one prompt are each
    other's longest prefix: the walk up the parents went round for ever (recursing, it
    had raised RecursionError)."""
    a = ActorRow("c", 0, "t", "t#0", 1, 1, 0, "v0", (1, 2), (), (), (), 1.0, 0.0, "stop")
    b = ActorRow("c", 0, "t", "t#0", 2, 2, 0, "v0", (1, 2), (), (), (), 1.0, 0.0, "stop")
    assert segment_weights([a, b], "reach") == {("t", "t#0", 1): 1.0, ("t", "t#0", 2): 1.0}
