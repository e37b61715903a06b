"""A tree's shape facts grown graft by graft (focus.search.shape) equal those computed
over the whole tree: spreads, counts per truncation rule, exploration draws, the
depth-share bound's counts."""

from __future__ import annotations

import random

import pytest

from focus.agent import CONTEXT_LIMIT
from focus.search.shape import known_shape, shape_fact
from focus.search.state import copy_tree
from focus.tree import RolloutRecord, Tree, Turn
from focus.usage import Usage

KEYS = ("spreads", "draws", "bootstrap", "terminal", "depths")


def _turn(rng: random.Random) -> Turn:
    n = rng.randint(1, 4)
    return Turn((1,) * rng.randint(1, 3), (5,) * n, (-0.5,) * n, 1, "stop", reward=rng.random())


def _graft(tree: Tree, rng: random.Random) -> Tree:
    """A copy of ``tree`` with a few rollouts added below its continuable checkpoints
    (as grafting adds them: a chain of checkpoints ending in a leaf of any kind, now
    and then a turnless context-limit leaf that takes its parent's branch state, and a
    log record per rollout)."""
    tree = copy_tree(tree)
    for _ in range(rng.randint(1, 3)):
        if not tree.states:
            break
        parent = start = rng.choice(sorted(tree.states))
        for _ in range(rng.randint(0, 2)):
            parent = tree.add_node(parent, (_turn(rng),), "checkpoint", steps=1).id
            tree.states[parent] = object()
        if rng.random() < 0.15:  # the checkpoint's next prompt does not fit the model
            tree.add_node(parent, (), "truncated", steps=1, cause=CONTEXT_LIMIT)
            tree.states.pop(parent, None)
        else:
            kind = rng.choice(("terminal", "truncated", "failed"))
            tree.add_node(parent, (_turn(rng),) * rng.randint(0, 2), kind, steps=1)
        phase = rng.randint(0, 2)
        tree.log.append(RolloutRecord(tree.rollouts, phase, "p", 0, start, 0, 0, False, None, "x", 0.0, 0.0, Usage()))
        tree.rollouts += 1
    return tree


@pytest.mark.parametrize("seed", range(20))
def test_grown_facts_equal_whole_tree_facts(seed: int) -> None:
    rng = random.Random(seed)
    tree = Tree.new("t", object(), (1, 2))
    shape = {k: shape_fact(tree, 3, k, None) for k in KEYS}
    known = known_shape(shape, tree, None)
    grown = 0
    for _ in range(12):
        tree = _graft(tree, rng)
        # some facts are read after each graft, others only after several
        shape = {k: shape_fact(tree, 3, k, known) for k in KEYS if rng.random() < 0.5}
        for key, fact in shape.items():
            assert fact == shape_fact(tree, 3, key, None), key
            grown += key in known
        known = known_shape(shape, tree, known)
    assert grown > 0


#: vLLM's refusal of a task's opening prompt over the context (the agent's failed leaf's cause).
REFUSED = (
    "model: POST http://m/v1/completions was rejected with status 400: This model's maximum context length is "
    "16 tokens. However, you requested 30 tokens"
)


@pytest.mark.parametrize("first_refused", [True, False])
def test_a_root_refused_at_its_opening_prompt_is_counted_without_its_branch_state(first_refused: bool) -> None:
    """Grafting takes the root's branch state where its first rollout was refused at the
    task's opening prompt as over the context (focus.search.grafting): the depth-share
    counts grown from the tree before must drop the root as the whole tree's count does
    (they kept it open, a checkpoint the plan can no longer continue)."""
    from focus.refusals import refused_task

    tree = Tree.new("t", object(), (1, 2))
    known = known_shape({"depths": shape_fact(tree, 3, "depths", None)}, tree, None)
    tree = copy_tree(tree)
    if first_refused:
        tree.add_node(Tree.ROOT, (), "failed", steps=0, cause=REFUSED)
        tree.states.pop(Tree.ROOT)
    else:
        tree.add_node(Tree.ROOT, (_turn(random.Random(1)),), "terminal", steps=1)
    tree.add_node(Tree.ROOT, (), "failed", steps=0, cause=REFUSED)
    assert (refused_task(tree) is not None) == first_refused
    assert shape_fact(tree, 3, "depths", known) == shape_fact(tree, 3, "depths", None)
