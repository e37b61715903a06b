"""Incremental rankings equal a from-scratch recomputation, on random trees.

Trees grow as search grows them (chains of new nodes below existing checkpoints,
predictions filled in later, failed and truncated leaves, segments of several
transitions); after every step the incrementally updated :class:`TreeRanking` must
hold exactly what :func:`tree_values` and :func:`node_evidence` compute from scratch,
and rank exactly the same way.
"""

from __future__ import annotations

import random

import pytest

from focus.estimation import NoiseModel, noise_model, tree_values
from focus.node_view import node_evidence
from focus.priority import Calibration, Phase, Selective, Uniform, calibrate
from focus.ranking import TreeRanking, entry
from focus.search import copy_tree
from focus.tree import Tree, Turn

PHASES = (Phase("evidence", rollouts_per_task=2), Phase("more", transitions=10**6, max_branches=3, max_depth=5))


def _turns(rng: random.Random) -> tuple[Turn, ...]:
    out = []
    for _ in range(rng.choice((1, 1, 1, 2))):
        action = rng.randrange(3)
        transition = rng.random() > 0.1
        reward = rng.choice((0.0, 0.0, 1.0, -0.3)) if transition else 0.0
        out.append(
            Turn((1,), (48 + action,) * rng.randint(1, 4), (-0.5,), 1, "stop", reward=reward, transition=transition)
        )
    return tuple(out)


def grow(tree: Tree, rng: random.Random) -> set[int]:
    """Continue a random checkpoint with a chain of new nodes and score some nodes;
    return the ids that changed (new, or newly scored)."""
    changed: set[int] = set()
    unscored = [n.id for n in tree.nodes.values() if n.value is None and n.kind in ("checkpoint", "truncated")]
    for nid in rng.sample(unscored, k=len(unscored) // 2):
        tree.nodes[nid].value = rng.uniform(-0.5, 1.5)
        changed.add(nid)
    for _ in range(rng.randint(1, 3)):
        parent = rng.choice([i for i in tree.states])
        for step in range(rng.randint(1, 4)):
            last = step == 3 or rng.random() < 0.3
            kind = rng.choice(("terminal", "terminal", "truncated", "failed")) if last else "checkpoint"
            node = tree.add_node(parent, _turns(rng), kind, steps=step + 1, context_ids=(1, 2), rollout=tree.rollouts)
            if rng.random() < 0.5 and kind in ("checkpoint", "truncated"):
                node.value = rng.uniform(-0.5, 1.5)
            if kind == "checkpoint":
                tree.states[node.id] = object()
            changed.add(node.id)
            parent = node.id
            if last:
                break
        tree.rollouts += 1
    return changed


def scratch(tree: Tree, search, calib: Calibration):  # type: ignore[no-untyped-def]
    values = tree_values(
        tree, gamma=search.discount, kappa=search.kappa, noise=calib.noise, truncation=search.truncation_rule
    )
    return values, node_evidence(tree, 0, values, calib)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "search",
    [
        Selective(phases=PHASES, gamma=0.9),
        Selective(phases=PHASES, kappa=1.0, truncation="terminal"),
        Uniform(phases=PHASES),
    ],
    ids=["selective", "selective-kappa-terminal", "uniform"],
)
def test_incremental_ranking_equals_a_rebuild(seed: int, search) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    tree = Tree.new("t", None, (1,))
    tree.root.value = 0.4
    changed = grow(tree, rng)
    # a calibration as search would fit it (known once the tree has spreads), and an unknown one
    calibs = [
        calibrate([tree], gamma=search.discount, truncation=search.truncation_rule),
        Calibration(NoiseModel.unknown()),
    ]
    for _ in range(12):
        tree = copy_tree(tree)
        changed |= grow(tree, rng)
    known = calibrate([tree], gamma=search.discount, truncation=search.truncation_rule)
    assert known.noise.known and noise_model([tree], gamma=search.discount).spreads > 3
    calibs.append(known)
    lazy = 0  # updates after which some view was left for later
    for calib in calibs:
        t = Tree.new("t", None, (1,))
        t.root.value = 0.4
        r = random.Random(seed)
        grow(t, r)
        live = TreeRanking(t, 0, search, calib, 7)
        live.ranked(t, 1)
        for _ in range(12):
            t = copy_tree(t)
            live.update(t, grow(t, r))
            values, evidence = scratch(t, search, calib)
            # ranked before any view is asked for: the views of checkpoints no phase
            # ranks (here: four children or more) wait, and ranking does not need them
            views_kept = len(live._views)
            assert live.ranked(t, 1) == sorted(
                entry(search, 7, ev)
                for ev in evidence.values()
                if ev.node_id in t.states and ev.depth <= 5 and ev.branches < 3
            )
            lazy += views_kept < len(evidence)
            assert live.evidence == evidence
            for name in ("value", "error", "critic_weight", "q_bar", "child_q", "m"):
                assert getattr(live.values, name) == {k: v for k, v in getattr(values, name).items()}, name
            fresh = TreeRanking(t, 0, search, calib, 7)
            assert live.ranked(t, 1) == fresh.ranked(t, 1)
            assert live.ranked(t, 1) == sorted(
                entry(search, 7, ev)
                for ev in evidence.values()
                if ev.node_id in t.states and ev.depth <= 5 and ev.branches < 3
            )
    assert lazy  # the random trees do grow checkpoints no phase ranks


def _values(r: TreeRanking) -> dict[str, dict[int, object]]:
    """Every per-node figure of a ranking, NaN as a string (a NaN equals only itself)."""
    names = ("value", "weight", "error", "plain", "q_bar", "child_q", "m", "lengths", "valid")
    return {n: {k: "nan" if v != v else v for k, v in getattr(r, n).items()} for n in names}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "search",
    [Selective(phases=PHASES, gamma=0.9), Selective(phases=PHASES, kappa=1.0)],
    ids=["selective", "selective-kappa"],
)
def test_one_update_of_several_waves_equals_an_update_per_wave(seed: int, search) -> None:  # type: ignore[no-untyped-def]
    """A tree whose ranking is brought up to date once after several waves (the
    changes of all of them at once) holds exactly what updates after every wave give:
    values, views, entries and their order."""
    rng = random.Random(seed)
    tree = Tree.new("t", None, (1,))
    tree.root.value = 0.4
    grow(tree, rng)
    for _ in range(6):
        tree = copy_tree(tree)
        grow(tree, rng)
    calib = calibrate([tree], gamma=search.discount, truncation=search.truncation_rule)
    per_wave = TreeRanking(tree, 0, search, calib, 7)
    coalesced = TreeRanking(tree, 0, search, calib, 7)
    per_wave.ranked(tree, 1)
    coalesced.ranked(tree, 1)
    for _ in range(4):
        pending: set[int] = set()
        for _ in range(rng.randint(1, 4)):
            tree = copy_tree(tree)
            changed = grow(tree, rng)
            per_wave.update(tree, changed)
            pending |= changed
        coalesced.update(tree, pending)
        assert (
            coalesced.ranked(tree, 1)
            == per_wave.ranked(tree, 1)
            == TreeRanking(tree, 0, search, calib, 7).ranked(tree, 1)
        )
        assert _values(coalesced) == _values(per_wave)
        assert coalesced.evidence == per_wave.evidence
        assert not coalesced._deferred and not per_wave._deferred


@pytest.mark.parametrize("kappa", [None, 1.0])
def test_each_node_is_refined_once_per_pass(monkeypatch: pytest.MonkeyPatch, kappa: float | None) -> None:
    """A ranking's build and each update back up every checkpoint they compute once
    (:meth:`TreeRanking._compute`): a checkpoint with a prediction is refined at its
    parent's step with its influence, not first without it and then again."""
    import focus.backups as backups
    import focus.ranking as ranking

    calls: list[int] = []
    real = backups.node_terms

    def counted(node, *args, **kw):  # type: ignore[no-untyped-def]
        calls.append(node.id)
        return real(node, *args, **kw)

    monkeypatch.setattr(ranking, "node_terms", counted)
    monkeypatch.setattr(backups, "node_terms", counted)  # node_value's (settle_children's)
    search = Selective(phases=PHASES, kappa=kappa)
    rng = random.Random(3)
    tree = Tree.new("t", None, (1,))
    tree.root.value = 0.4
    for _ in range(8):
        tree = copy_tree(tree)
        grow(tree, rng)
    calib = calibrate([tree], gamma=search.discount, truncation=search.truncation_rule)
    assert calib.noise.known
    live = TreeRanking(tree, 0, search, calib, 7)
    inner = sorted(n.id for n in tree.nodes.values() if not n.is_leaf)
    assert sorted(calls) == inner
    for _ in range(5):
        calls.clear()
        tree = copy_tree(tree)
        changed = grow(tree, rng)
        path = set()
        for i in changed:
            while i is not None and i not in path:
                path.add(i)
                pe = tree.nodes[i].parent_edge
                i = tree.edges[pe].parent if pe is not None else None
        live.update(tree, changed)
        # the path's inner nodes once each, and the path's children off it where a
        # parent's count of valid children moved (settle_children's, as before)
        on_path = sorted(i for i in calls if i in path)
        assert on_path == sorted(i for i in path if not tree.nodes[i].is_leaf)
