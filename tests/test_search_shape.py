"""A tree's shape facts grown graft by graft (focus.search.shape) equal those computed
over the whole tree: spreads, counts per truncation rule, exploration draws, the
depth-share bound's counts."""

from __future__ import annotations

import collections
import random
from types import SimpleNamespace

import pytest

from focus.agent import CONTEXT_LIMIT
from focus.search.heads import PlanIndex
from focus.search.shape import DepthChange, Depths, known_shape, shape_fact, tree_depths
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
            whole = shape_fact(tree, 3, key, None)
            if key == "depths":  # the counts; a grown one also says what its graft changed
                assert fact[:3] == whole[:3]
                assert (fact[3] is not None) == ("depths" in known)
                if fact[3] is not None:
                    assert isinstance(fact[3], DepthChange) and fact[3].base is known["depths"][0]
                    assert changed(fact[3].base, fact) == (fact[3].open, fact[3].starts)
            else:
                assert fact == whole, key
            grown += key in known
        known = known_shape(shape, tree, known)
    assert grown > 0


def changed(base: Depths, now: Depths) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """``now``'s counts less ``base``'s, keys at 0 left out (what a :class:`DepthChange` holds)."""
    out: list[dict[tuple[int, int], int]] = []
    for b, n in ((base[0], now[0]), (base[1], now[1])):
        diff = {k: n.get(k, 0) - b.get(k, 0) for k in {*b, *n}}
        out.append({k: v for k, v in diff.items() if v})
    return out[0], out[1]


@pytest.mark.parametrize("seed", range(10))
def test_the_plan_index_adds_what_each_graft_changed_to_the_counts_over_every_tree(seed: int) -> None:
    """The plan index adds a graft's :class:`DepthChange` where it counted the counts the
    graft grew from, and takes the whole counts away and adds the new ones where it did
    not (it skipped a graft, or the tree's counts were made over the whole tree): either
    way its sums are those of a pass over every tree (focus.search.heads.PlanIndex.depth_counts)."""
    rng = random.Random(seed)
    trees = [Tree.new(f"t{i}", object(), (1, 2)) for i in range(4)]
    facts = [{"depths": shape_fact(t, i, "depths", None)} for i, t in enumerate(trees)]
    index = PlanIndex(len(trees))
    state = SimpleNamespace(facts=lambda ti: SimpleNamespace(depths=facts[ti]["depths"]))
    deltas = 0
    for _ in range(40):
        ti = rng.randrange(len(trees))
        known = known_shape(facts[ti], trees[ti], None)
        trees[ti] = _graft(trees[ti], rng)
        # now and then the facts are made afresh (a tree changed in place, an unpickled state)
        fresh = rng.random() < 0.1
        facts[ti] = {"depths": shape_fact(trees[ti], ti, "depths", None if fresh else known)}
        index.moved((ti,))
        if rng.random() < 0.6:  # the index reads some grafts, and skips others
            change = facts[ti]["depths"][3]
            deltas += change is not None and change.base is index.depths[ti]
            assert index.depth_counts(state) == over_every_tree(trees)  # type: ignore[arg-type]
    assert index.depth_counts(state) == over_every_tree(trees)  # type: ignore[arg-type]
    assert deltas > 0


def over_every_tree(trees: list[Tree]) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    open_: collections.Counter[tuple[int, int]] = collections.Counter()
    starts: collections.Counter[tuple[int, int]] = collections.Counter()
    for tree in trees:
        o, s, _, _ = tree_depths(tree)
        open_.update(o)
        starts.update(s)
    return dict(open_), dict(starts)


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
    assert shape_fact(tree, 3, "depths", known)[:3] == shape_fact(tree, 3, "depths", None)[:3]
