"""The faster per-tree computations of planning and batch preparation equal the
computations they replace, on random trees (issue 37: search and prepare CPU per
transition).

Each reference below is the former code, kept here as the definition: the batch must
stay bit-identical (tests/repin.py), so every comparison is exact, not approximate.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping

import pytest
from test_ranking import grow

from focus import backups
from focus.calibration import Calibration, calibrate
from focus.estimation import (
    CriticTarget,
    DirectBranchTd,
    GroupNormalized,
    NodeMonteCarlo,
    NoiseModel,
    Segment,
    TreeValues,
    child_variances,
    critic_targets,
    first_step_weight,
    node_value,
    noise_model,
    refine,
    segment,
    tree_values,
    value_influence,
)
from focus.node_view import _spread_factor, node_evidence, node_view, segment_length, shared_error, valid_tokens
from focus.priority import EXPLORE, NodeEvidence, Selective, explores, make_evidence
from focus.search import copy_tree
from focus.sums import left_sum
from focus.tree import Edge, Node, Tree
from focus.weighting import checkpoint_critic_error


def reference_critic_targets(tree: Tree, gamma: float, truncation: str) -> dict[int, CriticTarget]:
    """``critic_targets`` as it was: a whole ``tree_values`` backup with κ = 0."""
    tv = tree_values(tree, gamma=gamma, kappa=0.0, truncation=truncation)  # type: ignore[arg-type]
    out: dict[int, CriticTarget] = {}
    for node in tree.checkpoints():
        q = tv.q_bar[node.id]
        if q is None:
            out[node.id] = CriticTarget(node.id, node.value if node.value is not None else 0.0, 0.0)
        else:
            out[node.id] = CriticTarget(node.id, q, float(tv.m[node.id]))
    return out


def random_trees(seed: int, steps: int = 10) -> list[Tree]:
    """A tree grown ``steps`` times as search grows one (chains below checkpoints,
    failed and truncated leaves, multi-transition segments, some nodes unscored), with
    every intermediate tree."""
    rng = random.Random(seed)
    tree = Tree.new("t", None, (1,))
    if rng.random() < 0.8:
        tree.root.value = rng.uniform(-0.5, 1.5)
    out = [tree]
    for _ in range(steps):
        tree = copy_tree(tree)
        grow(tree, rng)
        out.append(tree)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("gamma", "truncation"), [(1.0, "bootstrap"), (0.9, "bootstrap"), (0.97, "terminal")])
def test_critic_targets_equal_the_full_backup(seed: int, gamma: float, truncation: str) -> None:
    for tree in random_trees(seed):
        got = critic_targets(tree, gamma=gamma, truncation=truncation)  # type: ignore[arg-type]
        want = reference_critic_targets(tree, gamma, truncation)
        assert list(got) == list(want)  # same checkpoints, same order
        assert got == want  # bit for bit
    # the trees exercise every case: a checkpoint without a valid child, several valid children
    assert any(t.weight == 0.0 for t in got.values()) and any(t.weight >= 2 for t in got.values())


def reference_segment(e: Edge, gamma: float) -> Segment:
    """``segment`` as it was: one pass over the turns per property."""
    k = e.k
    return Segment(e.child, e.discounted_reward(gamma), gamma**k, first_step_weight(k, gamma), k, e.n_tokens)


def reference_td(edges: list[Edge], value: dict[int, float | None], gamma: float) -> dict[int, float]:
    """The segment TD advantages as ``_segment_td`` computed them, from the edges."""
    out = {}
    for e in edges:
        vc, vp = value.get(e.child), value.get(e.parent)
        if vc is not None and vp is not None:
            out[e.id] = e.discounted_reward(gamma) + gamma**e.k * vc - vp
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.5])
def test_segments_and_advantages_equal_the_per_edge_computation(seed: int, gamma: float) -> None:
    tree = random_trees(seed)[-1]
    for e in tree.edges.values():
        got, want = segment(e, gamma), reference_segment(e, gamma)
        assert got == want and type(got.reward) is type(want.reward)
        # an env that rewards in ints (or bools): the same float as before
        ints = dataclasses.replace(e, turns=tuple(dataclasses.replace(t, reward=int(t.reward * 3)) for t in e.turns))
        got, want = segment(ints, gamma), reference_segment(ints, gamma)
        assert got == want and type(got.reward) is type(want.reward)
    for est in (DirectBranchTd(gamma=gamma), NodeMonteCarlo(gamma=gamma)):
        values = est.values(tree)
        assert set(values.segments) == set(tree.edges)
        edges = list(tree.edges.values())
        source = values.value if isinstance(est, DirectBranchTd) else values.mc
        want = reference_td(edges, dict(source), gamma)
        assert want and est.advantages(edges, values) == want
        # values without segments (as a ranking's) give the same advantages from the edges
        bare = dataclasses.replace(values, segments={})
        assert est.advantages(edges, bare) == want


def reference_node_view(
    tree: Tree,
    node: Node,
    tree_index: int,
    values: TreeValues,
    calibration: Calibration,
    segs: Mapping[int, Segment],
    length: float,
    valid: Mapping[int, float],
    pending: int = 0,
) -> NodeEvidence:
    """``node_view`` as it was (its helpers called, the view built through
    ``NodeEvidence.build``)."""
    i = node.id
    mu = calibration.mean_tokens or 1.0
    gamma = values.gamma
    noise = calibration.noise
    infl, t_infl = _influence(tree, node, values, segs, valid, mu)
    sig, rest, plain, n = 0.0, 0.0, 0.0, 0
    step, action = noise.step_var(node.depth), noise.action_var(node.depth)
    for eid in node.children:
        sg = segs[eid]
        if values.value.get(sg.child) is None:
            continue
        a, b = child_variances(sg.weight, sg.discount, values.error[sg.child], step, action)
        sig, rest, n = sig + a, rest + b, n + 1
        plain += step * sg.weight + sg.discount * sg.discount * values.plain_error.get(sg.child, 0.0)
    if math.isnan(length):
        length = max(1.0, calibration.mean_leaf_transitions - node.transitions)
    chain = calibration.fresh_chain(node.depth + 1, max(int(round(length)) - 1, 0))
    fresh = noise.noise_var(node.depth) + gamma * gamma * chain.head_error
    fresh_target = step + gamma * gamma * chain.head_target
    if n:
        sig, rest, plain = sig / n, rest / n, plain / n
    else:
        sig, rest, plain = action, fresh, fresh_target
    qs = values.child_q.get(i, ())
    critic = noise.critic_at(node.depth)
    q_bar = values.q_bar.get(i)
    if qs and q_bar is not None and node.value is not None and noise.known:
        critic = checkpoint_critic_error(node.value, qs, q_bar, (sig + rest) / n, critic, only_child=True)
    shared, rest = shared_error(calibration, node.depth, length, rest)
    rho = _spread_factor(node, qs, sig + rest, noise, critic)
    sig, rest = rho * sig, rho * rest
    return NodeEvidence.build(
        tree_index=tree_index,
        node_id=i,
        depth=node.depth,
        transitions=node.transitions,
        value=node.value,
        value_std=node.value_std,
        refined=values.value.get(i),
        q_bar=values.q_bar.get(i),
        child_values=qs,
        m=values.m.get(i, 0),
        branches=len(node.children),
        pending=pending,
        influence=infl,
        expected_transitions=max(length, 1.0),
        child_tokens=valid[i] / mu,
        critic_weight=values.critic_weight.get(i, 0.0),
        signal=sig,
        child_error=rest,
        critic_var=critic,
        fresh_error=fresh,
        chain_error=chain.segments,
        target_var=plain,
        fresh_target=fresh_target,
        chain_target=chain.targets,
        target_influence=t_infl,
        target_weight=calibration.target_weight,
        rollout_transitions=calibration.mean_leaf_transitions,
        shared_error=shared,
        value_influence=_value_influence(tree, node, values, segs),
    )


def _influence(
    tree: Tree, node: Node, values: TreeValues, segs: Mapping[int, Segment], valid: Mapping[int, float], mu: float
) -> tuple[float, float]:
    """How much V(n) moves the advantages above it, and the critic target of its parent
    segment (see :func:`node_view`); 0 for a root or a node without a value."""
    if node.parent_edge is None or values.value.get(node.id) is None:
        return 0.0, 0.0
    sp = segs[node.parent_edge]
    p = tree.edges[node.parent_edge].parent
    lam_p, m_p = values.critic_weight.get(p, 0.0), values.m.get(p, 0)
    if not m_p:
        return 0.0, 0.0
    c = (1.0 - lam_p) * sp.discount / m_p
    own = sp.discount - c
    return (own * own * sp.tokens + c * c * (valid[p] - sp.tokens)) / mu, sp.discount * sp.discount / m_p


def _value_influence(tree: Tree, node: Node, values: TreeValues, segs: Mapping[int, Segment]) -> float:
    """:func:`focus.estimation.value_influence` of ``node`` (0 for a root)."""
    if node.parent_edge is None:
        return 0.0
    return value_influence(segs[node.parent_edge].discount, values.m.get(tree.edges[node.parent_edge].parent, 0))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_node_view_equals_the_former_one(seed: int, gamma: float) -> None:
    trees = random_trees(seed, steps=12)
    for tree in trees[3:]:
        for known in (True, False):
            calib = calibrate([tree], gamma=gamma) if known else Calibration(NoiseModel.unknown())
            calib = dataclasses.replace(calib, mean_tokens=2.5)
            values = tree_values(tree, gamma=gamma, noise=calib.noise)
            segs = {i: segment(e, gamma) for i, e in tree.edges.items()}
            lengths: dict[int, float] = {}
            valid: dict[int, float] = {}
            for node in tree.postorder():
                lengths[node.id] = segment_length(node, segs, lengths)
                valid[node.id] = valid_tokens(node, segs, values.value)
            views = 0
            for node in tree.checkpoints():
                for pending in (0, 2):
                    args = (tree, node, 3, values, calib, segs, lengths[node.id], valid, pending)
                    got, want = node_view(*args), reference_node_view(*args)
                    assert type(got) is NodeEvidence and got == want  # every field, bit for bit
                    views += 1
            assert views >= 8
    # the trees have what the view's branches read: parents with several valid children,
    # checkpoints without a valid child, a known noise model
    assert calibrate([trees[-1]], gamma=gamma).noise.known


def test_evidence_copies_and_builds_equal_the_dataclass() -> None:
    names = [f.name for f in dataclasses.fields(NodeEvidence)]
    fields = {n: float(i) + 0.5 for i, n in enumerate(names)}
    made = make_evidence(**fields)
    assert made == NodeEvidence(**fields) == NodeEvidence.build(**fields)  # type: ignore[arg-type]
    assert make_evidence(*fields.values()) == made  # in field order, as node_view calls it
    assert made.with_pending(7) == dataclasses.replace(made, pending=7)
    with pytest.raises(TypeError):
        make_evidence(**{n: v for n, v in fields.items() if n != "signal"})
    # made through a slotted twin whose class is then set: a frozen NodeEvidence all the same
    for view in (made, made.with_pending(7)):
        assert type(view) is NodeEvidence and not hasattr(view, "__dict__")
        assert hash(view) == hash(NodeEvidence(**{**fields, "pending": view.pending}))  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            view.signal = 1.0  # type: ignore[misc]


def test_target_weight_is_cached_per_calibration() -> None:
    cal = Calibration(NoiseModel((0.04, 0.02, 0.01), 0.01, (0.02, 0.01, 0.005)), mean_leaf_transitions=3.0)
    first = cal.target_weight
    assert first > 0 and cal.target_weight == first
    # a copy with another noise model computes its own (the cache is not an __init__ field)
    other = dataclasses.replace(cal, noise=NoiseModel.unknown(), _chains={})
    assert other.target_weight == 0.0 and cal.target_weight == first


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kappa", [None, 0.0, 1.5])
def test_node_value_equals_refine_over_child_tuples(seed: int, kappa: float | None) -> None:
    """``node_value`` sums its children in a loop of its own; ``refine`` over the tuples
    it used to build is the definition."""
    tree = random_trees(seed, steps=12)[-1]
    gamma = 0.95
    for noise in (noise_model([tree], gamma=gamma), NoiseModel.unknown()):
        tv = tree_values(tree, gamma=gamma, kappa=kappa, noise=noise)
        segs = {i: segment(e, gamma) for i, e in tree.edges.items()}
        value, error, plain = dict(tv.value), dict(tv.error), dict(tv.plain_error)
        checked = 0
        for node in tree.checkpoints():
            for influence in (0.0, 0.7):
                kids = [
                    (segs[e].reward, segs[e].discount, value[segs[e].child], error[segs[e].child], segs[e].weight,
                     plain[segs[e].child])
                    for e in node.children
                ]  # fmt: skip
                want = refine(node.value, kids, noise, node.depth, kappa, influence)
                got = node_value(node, segs, value, error, noise, kappa, "bootstrap", plain, influence)
                assert got == want
                checked += want.q_bar is not None
        assert checked >= 4
    assert noise_model([tree], gamma=gamma).known


def reference_score(search: Selective, node: NodeEvidence) -> float:
    """``Selective.__call__`` as it was: every error term through the public methods,
    each computing its own λ."""
    slot = node.branches + node.pending
    if search.explore > 0 and slot >= 1:
        rate = search.explore / (1.0 + max(node.rollout_transitions, 0.0))
        if explores(node.tree_index, node.node_id, slot, rate):
            return EXPLORE
    if not math.isfinite(node.critic_var):
        return 0.0
    n = node.m + node.pending
    e = node.child_error
    change = search.segment_error(node, n + 1, node.fresh_error) + node.chain_error
    if n:
        per_child = node.child_tokens / node.m if node.m else 1.0
        change += n * per_child * (search.segment_error(node, n + 1, e) - search.segment_error(node, n, e))
    if search.use_influence:
        change += node.influence * (search.error(node, n + 1) - search.error(node, n))
    if search.targets:
        change += node.target_weight * search.target_change(node)
    cost = node.expected_transitions if search.per_transition else 1.0
    return -change / cost


class PublicTerms(Selective):
    """A subclass overriding the error terms (with the same formulas): scored through
    them, not through the λ-reusing path."""

    def error(self, node: NodeEvidence, m: int) -> float:
        return super().error(node, m)

    def segment_error(self, node: NodeEvidence, m: int, noise: float) -> float:
        return super().segment_error(node, m, noise)


@pytest.mark.parametrize("seed", range(4))
def test_selective_score_equals_the_former_one(seed: int) -> None:
    tree = random_trees(seed, steps=12)[-1]
    calib = calibrate([tree], gamma=1.0)
    assert calib.noise.known
    evidence = node_evidence(tree, 0, tree_values(tree, noise=calib.noise), calib)
    searches = [
        Selective(),
        Selective(kappa=1.0),
        Selective(explore=0.0, use_influence=False),
        Selective(targets=False, per_transition=False),
    ]
    scored = 0
    for search in searches:
        for ev in evidence.values():
            for pending in (0, 1, 3):
                view = ev.with_pending(pending)
                want = reference_score(search, view)
                assert search(view) == want
                assert PublicTerms(**search.model_dump())(view) == want
                scored += want not in (0.0, EXPLORE)
    assert scored >= 20


def test_per_depth_terms_equal_the_noise_models_own() -> None:
    """``Calibration.at_depth`` and ``NoiseModel.backup_terms`` keep what the noise model's
    methods give at each depth (read beyond the fitted depths too), and a copy of either
    starts without the other's."""
    fitted = noise_model([random_trees(3, steps=12)[-1]], gamma=0.9)
    assert fitted.known
    models = [
        fitted,
        NoiseModel((0.04, 0.02, 0.01), 0.01, (0.02, 0.03, 0.005), critic_vars=(0.02, 0.015)),
        NoiseModel.unknown(),
        NoiseModel((), 0.5),
    ]
    for noise in models:
        calib = Calibration(noise, mean_leaf_transitions=3.0)
        for _ in range(2):  # computed, then kept
            for d in range(12):
                assert calib.at_depth(d) == (
                    noise.step_var(d),
                    noise.action_var(d),
                    noise.noise_var(d),
                    noise.critic_at(d),
                )
                assert noise.backup_terms(d) == (noise.step_var(d), noise.action_var(d), noise.critic_error_at(d))
        other = dataclasses.replace(calib, noise=NoiseModel((9.0,), 1.0))
        assert other.at_depth(0) == (9.0, 9.0, 0.0, 1.0) and other.noise.backup_terms(0) == (9.0, 9.0, 1.0)
        assert dataclasses.replace(noise) == noise and hash(dataclasses.replace(noise)) == hash(noise)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kappa", [None, 0.0, 1.5])
def test_ranking_lengths_and_tokens_equal_the_per_node_functions(seed: int, kappa: float | None) -> None:
    """``TreeRanking._compute`` sums a node's children's lengths and valid tokens in the
    pass that counts them; ``segment_length`` and ``valid_tokens`` are the definition."""
    from focus.ranking import TreeRanking

    tree = random_trees(seed, steps=12)[-1]
    search = Selective(gamma=0.95, kappa=kappa)
    calib = calibrate([tree], gamma=0.95)
    rank = TreeRanking(tree, 0, search, calib, 7)
    lengths: dict[int, float] = {}
    for node in tree.postorder():
        want = segment_length(node, rank.segments, lengths)
        lengths[node.id] = want
        got = rank.lengths[node.id]
        assert got == want or (math.isnan(got) and math.isnan(want))
        assert type(got) is float
        assert rank.valid[node.id] == valid_tokens(node, rank.segments, rank.value)
    assert any(math.isnan(x) for x in lengths.values()) or len(lengths) > 10


@pytest.mark.parametrize("seed", range(4))
def test_selective_score_equals_the_former_one_without_a_prediction(seed: int) -> None:
    """The written-out score where λ is 0 for want of a prediction, and with κ = 0."""
    tree = random_trees(seed, steps=12)[-1]
    calib = calibrate([tree], gamma=1.0)
    evidence = node_evidence(tree, 0, tree_values(tree, noise=calib.noise), calib)
    scored = 0
    for search in (Selective(explore=0.0), Selective(kappa=0.0, explore=0.0)):
        for ev in evidence.values():
            for value in (None, 0.3):
                for pending in (0, 2):
                    view = dataclasses.replace(ev, value=value, pending=pending)
                    want = reference_score(search, view)
                    assert search(view) == want
                    scored += want != 0.0
    assert scored >= 20


def test_slot_hashes_equal_the_hash_of_the_tuples_repr() -> None:
    """``explores`` and the ranking's ``tie`` write the repr of their parts out for ints;
    the hash of ``repr(parts)`` (``derive_seed``'s) is the definition, and anything but
    an int still goes through it."""
    import hashlib

    from focus.agent import derive_seed
    from focus.ranking import tie

    def reference_explores(tree_index: object, node_id: object, branch: object, rate: float) -> bool:
        digest = hashlib.blake2b(repr(("explore", tree_index, node_id, branch)).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") / 2.0**64 < rate

    rng = random.Random(5)
    drawn = 0
    for _ in range(3000):
        ti, nid, b, seed = rng.randrange(4000), rng.randrange(10**6), rng.randrange(1, 9), rng.randrange(-5, 2**40)
        rate = rng.choice([0.01, 0.3, 0.9])
        assert explores(ti, nid, b, rate) == reference_explores(ti, nid, b, rate)
        drawn += explores(ti, nid, b, rate)
        assert tie(seed, ti, nid, b) == derive_seed("tie", seed, ti, nid, b) / 2**31
    assert 0 < drawn < 3000
    odd = ("3", True, 2.0)  # not ints: the tuple's repr, as before
    assert tie(0, 1, *odd[1:]) == derive_seed("tie", 0, 1, True, 2.0) / 2**31
    assert {explores(1, True, 2, r) == reference_explores(1, True, 2, r) for r in (0.1, 0.5, 0.9)} == {True}


def reference_collect(tree: Tree, gamma: float, truncation: str, keep, out: list, segments=None) -> None:  # type: ignore[no-untyped-def]
    """``focus.noise_rows.collect`` as it was (a checkpoint's row made by its dataclass
    ``__init__``, its children grouped by first action in one pass)."""
    from focus.noise_rows import _CRITIC, _EXACT, DEPTH_BUCKETS, Checkpoint

    nodes, edges = tree.nodes, tree.edges
    segs = segments if segments is not None else {}
    val: dict[int, float | None] = {}
    ref: dict[int, int] = {}
    boot = truncation == "bootstrap"
    for i in sorted(nodes, reverse=True):
        node = nodes[i]
        if node.parent_edge is not None and keep is not None and not keep(tree, edges[node.parent_edge]):
            continue
        kind = node.kind
        if kind != "checkpoint":
            if kind == "terminal" or (kind == "truncated" and truncation == "terminal"):
                val[i] = 0.0
            else:
                val[i] = node.value if kind == "truncated" else None
            ref[i] = _CRITIC if kind == "truncated" and boot else _EXACT
            continue
        qs: list[float] = []
        kids: list[tuple[float, float, int, float]] = []
        groups: list[int] = []
        index: dict[tuple[int, ...], int] = {}
        for eid in node.children:
            sg = segs.get(eid)
            if sg is None:
                sg = segs[eid] = segment(edges[eid], gamma)
            c = sg.child
            vc = val.get(c)
            if vc is None:
                continue
            disc = sg.discount
            qs.append(sg.reward + disc * vc)
            turns = edges[eid].turns
            groups.append(index.setdefault(turns[0].completion_ids if turns else (), len(index)))
            kids.append((sg.weight, disc * disc, ref[c], 0.0))
        m = len(qs)
        if not m:
            val[i], ref[i] = node.value, _CRITIC
            continue
        q_bar = left_sum(qs) / m
        ss = left_sum((q - q_bar) ** 2 for q in qs) if m >= 2 else None
        ss_same = None
        if len(index) < m:
            members: dict[int, list[float]] = {}
            for q, g in zip(qs, groups, strict=True):
                members.setdefault(g, []).append(q)
            ss_same = left_sum(left_sum((q - left_sum(v) / len(v)) ** 2 for q in v) for v in members.values())
            sizes = [len(members[g]) for g in groups]
            kids = [(w, d, c, (n - 1) / n) for (w, d, c, _), n in zip(kids, sizes, strict=True)]
        d2 = (node.value - q_bar) ** 2 if node.value is not None else None
        val[i], ref[i] = q_bar, len(out)
        depth = node.depth
        out.append(Checkpoint(min(depth, DEPTH_BUCKETS - 1), depth, m, ss, ss_same, d2, node.value, kids))


def _fields(row: object) -> list[tuple[str, type, object]]:
    """Every field of a row with its value's type (a slotted row has no ``__dict__``)."""
    return [(f.name, type(getattr(row, f.name)), getattr(row, f.name)) for f in dataclasses.fields(row)]  # type: ignore[arg-type]


@pytest.mark.parametrize(("gamma", "truncation"), [(1.0, "bootstrap"), (0.9, "bootstrap"), (0.97, "terminal")])
def test_noise_rows_equal_the_former_collect(gamma: float, truncation: str) -> None:
    from focus.noise_rows import collect

    def keep(tree: Tree, e: Edge) -> bool:  # a filter that drops some subtrees
        return e.rollout % 3 != 1

    rows = []
    for tree in (t for seed in range(8) for t in random_trees(seed, steps=14)):
        for flt in (None, keep):
            segs: dict[int, Segment] = {}
            got: list = []  # type: ignore[type-arg]
            collect(tree, gamma, truncation, flt, got, segs)  # type: ignore[arg-type]
            want: list = []  # type: ignore[type-arg]
            reference_collect(tree, gamma, truncation, flt, want)
            assert got == want  # bit for bit (dataclass equality: every field, in order)
            assert [_fields(r) for r in got] == [_fields(r) for r in want]
            assert set(segs) <= set(tree.edges)  # the segments it made are kept for the caller
            rows += got
    # the trees exercise every case: only children, spreads, same-action groups, unscored checkpoints
    assert any(r.m == 1 for r in rows) and any(r.ss is not None for r in rows)
    assert any(r.ss_same is not None for r in rows) and any(r.d2 is None for r in rows)


def reference_monte_carlo(tree: Tree, gamma: float) -> dict[int, float | None]:
    """The Monte Carlo values as ``tree_values`` computed them in its backup loop: the
    mean return from each node over the valid leaves below it."""
    tv = tree_values(tree, gamma=gamma, kappa=0.0)
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    for node in tree.postorder():
        i = node.id
        if node.is_leaf:
            v = tv.value[i]
            total[i], count[i] = (v, 1) if v is not None else (0.0, 0)
            continue
        s, n = 0.0, 0
        for eid in node.children:
            sg = segment(tree.edges[eid], gamma)
            if count[sg.child]:
                s += count[sg.child] * sg.reward + sg.discount * total[sg.child]
                n += count[sg.child]
        total[i], count[i] = s, n
    return {i: (total[i] / count[i] if count[i] else None) for i in tree.nodes}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_returns_are_computed_when_first_read(seed: int, gamma: float) -> None:
    """``tree_values`` leaves the Monte Carlo values and the returns from the root until
    an estimator reads them (the collector's DirectBranchTd reads neither); read, they
    are the numbers the backup computed before, and the values equal an eager copy."""
    tree = random_trees(seed)[-1]
    est = DirectBranchTd(gamma=gamma)
    values = est.values(tree)
    est.advantages(list(tree.edges.values()), values)
    assert values.mc._src._out is None  # type: ignore[attr-defined]  # nothing read them
    mc = reference_monte_carlo(tree, gamma)
    root_return, leaf_returns = backups._root_returns(tree, values.segments, values.value)
    assert dict(values.mc) == mc and list(values.mc) == list(tree.nodes)
    assert values.root_return == root_return and values.root_return.get(-1, 0.5) == 0.5
    assert values.leaf_returns == leaf_returns and tuple(values.leaf_returns) == leaf_returns
    assert len(values.leaf_returns) == len(leaf_returns) and values.leaf_returns[::-1] == leaf_returns[::-1]
    eager = dataclasses.replace(values, mc=mc, root_return=root_return, leaf_returns=leaf_returns)
    assert values == eager and eager == values
    assert GroupNormalized(gamma=gamma).advantages(list(tree.edges.values()), values) == GroupNormalized(
        gamma=gamma
    ).advantages(list(tree.edges.values()), eager)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("gamma", "truncation"), [(1.0, "bootstrap"), (0.9, "bootstrap"), (0.97, "terminal")])
def test_backup_refining_once_equals_settling_after(seed: int, gamma: float, truncation: str) -> None:
    """``tree_values`` refines a checkpoint with a prediction once, at its parent's step:
    the numbers of the backup that refined it at its own step and again in its
    parent's ``settle_children``, bit for bit."""
    for tree in random_trees(seed, steps=12)[2:]:
        noise = noise_model([tree], gamma=gamma, truncation=truncation)  # type: ignore[arg-type]
        segs = {i: segment(e, gamma) for i, e in tree.edges.items()}
        want: dict[str, dict[int, object]] = {k: {} for k in ("value", "weight", "error", "plain", "q", "qs", "m")}
        value, weight, error, plain = want["value"], want["weight"], want["error"], want["plain"]
        for node in tree.postorder():
            if not node.is_leaf:
                backups.settle_children(tree, node, segs, value, weight, error, plain, noise, None, truncation)  # type: ignore[arg-type]
            r = node_value(node, segs, value, error, noise, None, truncation, plain)  # type: ignore[arg-type]
            value[node.id], weight[node.id], error[node.id], plain[node.id] = r.value, r.weight, r.error, r.plain_error
            if not node.is_leaf:
                want["q"][node.id], want["qs"][node.id], want["m"][node.id] = r.q_bar, r.qs, len(r.qs)
        got = tree_values(tree, gamma=gamma, noise=noise, truncation=truncation)  # type: ignore[arg-type]
        assert (got.value, got.critic_weight, got.error, got.plain_error) == (value, weight, error, plain)
        assert (got.q_bar, got.child_q, got.m) == (want["q"], want["qs"], want["m"])
