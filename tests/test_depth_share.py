"""The bound on the ranking's concentration (focus.search.depth_share,
``Selective.depth_share``, issue 31 mechanism 3): a continuation phase's checkpoints of
one depth take at most ``depth_share`` times uniform branching's share of its
continuations, plus one."""

from __future__ import annotations

import collections
import random

import pytest

from focus.agent import Agent
from focus.collector import Collector
from focus.env import Task
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.priority import Phase, Selective, Uniform
from focus.search import SearchState, plan_wave
from focus.search.depth_share import DepthShare, phase_starts, uniform_shares
from focus.search.heads import plan_index
from focus.synthetic import FAMILIES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.testing import run


def evidence(family: str, depth_share: float, budget: float = 3.0) -> tuple[Selective, SearchState]:
    """Six tasks of ``family`` after the evidence phase, an exact critic, and a search
    whose one continuation phase is ``budget`` rollouts per task (one wave)."""
    fam = FAMILIES[family]
    mdps = [fam.make(i) for i in range(6)]
    cont = Phase("continue", transitions=round(fam.horizon * 6 * budget))
    search = Selective(phases=(Phase("evidence", rollouts_per_task=2), cont), depth_share=depth_share)
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=fam.horizon + 2)
    critic = SyntheticCritic(mdps, 0.0, gamma=fam.gamma)
    col = Collector(
        agent, search, critic, DirectBranchTd(gamma=fam.gamma), Execution(max_concurrency=4), collection_id="d", seed=0
    )
    state = run(col.run_evidence([Task(f"t{i}", {"mdp": i}) for i in range(len(mdps))]))
    return col.priority, state  # type: ignore[return-value]


def wave_fill(state: SearchState, search: Selective) -> float:
    """The expected transitions a first continuation wave reaches: ``wave_size`` half
    rollouts, or the phase's budget where that is less (focus.search.planning.wave_limits)."""
    cont = search.phases[1]
    half = state.calibration(search).mean_leaf_transitions / 2
    return min(cont.wave_size * half, cont.transitions or 0)


def excess(state: SearchState, search: Selective, factor: float) -> float:
    """How far the first continuation wave's busiest depth goes over ``factor`` times its
    uniform share of the wave, plus one (> 0: the bound is broken)."""
    plan = plan_wave(state, search, 1, 0)
    shares = uniform_shares(state, search.phases[1])
    depths = collections.Counter(state.trees[j.tree_index].nodes[j.node_id].depth for j in plan.jobs)
    n = len(plan.jobs)
    return max(c - (factor * shares.get(d, 0.0) * n + 1) for d, c in depths.items())


@pytest.mark.parametrize("family", ["long", "timing", "forage"])
def test_a_wave_keeps_each_depth_within_its_bound(family: str) -> None:
    # without the bound the ranking piles the wave onto one depth (long and timing:
    # their last step; forage: its second) far beyond twice uniform's share
    search, state = evidence(family, 0.0)
    assert excess(state, search, 2.0) > 3
    bounded, state = evidence(family, 2.0)
    assert excess(state, bounded, 2.0) <= 0


def test_the_bound_spends_the_same_budget() -> None:
    # the wave is as full as without the bound: checkpoints of a full depth leave the
    # wave, the next best of other depths take their place
    for ds in (0.0, 2.0):
        search, state = evidence("long", ds)
        plan = plan_wave(state, search, 1, 0)
        assert sum(plan.expected) >= wave_fill(state, search)


def test_where_every_depth_is_full_the_wave_takes_the_rest_unbounded() -> None:
    # a bound so tight that each depth may take only its one continuation: the wave
    # is as full as without it, it takes the held checkpoints in rank order
    search, state = evidence("long", 1e-9)
    plan = plan_wave(state, search, 1, 0)
    assert sum(plan.expected) >= wave_fill(state, search)
    depths = collections.Counter(state.trees[j.tree_index].nodes[j.node_id].depth for j in plan.jobs)
    assert max(depths.values()) > 1


def test_the_running_bound() -> None:
    share = DepthShare(2.0, {0: 0.25, 1: 0.75}, {})
    # depth 0 may hold 2·0.25·(N + 1) + 1 of N + 1 continuations
    assert share.allows(0)
    share.take(0)
    assert share.allows(0)  # 2 <= 2·0.25·2 + 1 = 2
    share.take(0)
    assert share.total == 2 and share.starts == {0: 2}
    assert not share.allows(0)  # 3 > 2·0.25·3 + 1 = 2.5
    assert share.allows(1)
    share.take(1)
    share.take(1)
    assert share.allows(0)  # 3 <= 2·0.25·5 + 1 = 3.5
    assert share.allows(7) and not DepthShare(2.0, {0: 1.0}, {7: 1}).allows(7)  # no share: one only


@pytest.mark.parametrize("seed", range(5))
def test_the_bound_answers_what_its_formula_does_between_takes(seed: int) -> None:
    # DepthShare keeps its answers until the next take (a late wave asks about a full
    # depth thousands of times between takes): each must be the formula's at that moment
    rng = random.Random(seed)
    shares = {d: rng.random() for d in range(6)}
    total = sum(shares.values())
    share = DepthShare(rng.choice((0.5, 1.0, 3.0)), {d: v / total for d, v in shares.items()}, {1: rng.randint(0, 9)})
    refused = 0
    for _ in range(400):
        d = rng.randrange(7)
        fresh = share.starts.get(d, 0) + 1 <= share.factor * share.shares.get(d, 0.0) * (share.total + 1) + 1
        assert share.allows(d) == fresh
        refused += not fresh
        if fresh and rng.random() < 0.5:
            share.take(d)
    assert refused > 0 and share.total > 10


def test_the_phase_starts_count_the_pending_continuations() -> None:
    search, state = evidence("long", 0.0)
    assert phase_starts(state, 1, {}) == {}
    tree = state.trees[2]
    nid = next(n for n in tree.states if tree.nodes[n].depth == 3)
    assert phase_starts(state, 1, {(2, nid): 2}) == {3: 2}
    assert phase_starts(state, 0, {}) == {0: 12}  # the evidence: two rollouts from each of six roots


def test_only_selective_bounds_by_default() -> None:
    assert Uniform().depth_share_bound() == 0.0
    assert Selective().depth_share_bound() == 3.0  # the default (docs/algorithm.md, "Depth share")
    assert Selective(depth_share=2.5).depth_share_bound() == 2.5
    assert Selective(depth_share=0).depth_share_bound() == 0.0


def counted_over_every_tree(state: SearchState) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """The plan index's depth counts by a pass over every tree: the reference."""
    open_: collections.Counter[tuple[int, int]] = collections.Counter()
    starts: collections.Counter[tuple[int, int]] = collections.Counter()
    for tree in state.trees:
        open_.update((tree.nodes[n].depth, len(tree.nodes[n].children)) for n in tree.states)
        starts.update((r.phase, tree.nodes[r.node].depth) for r in tree.log)
    return dict(open_), dict(starts)


def test_the_depth_counts_kept_wave_by_wave_are_those_of_every_tree() -> None:
    # the plan index brings its counts up to date from the trees each wave changed
    # (focus.search.heads.PlanIndex.depth_counts); they must equal a pass over all trees
    search, state = evidence("forage", 3.0, budget=6.0)
    fam = FAMILIES["forage"]
    mdps = [fam.make(i) for i in range(6)]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=fam.horizon + 2)
    col = Collector(
        agent,
        search,
        SyntheticCritic(mdps, 0.0, gamma=fam.gamma),
        DirectBranchTd(gamma=fam.gamma),
        Execution(max_concurrency=4),
        collection_id="d",
        seed=0,
    )
    waves = 0
    for wave in range(50):
        plan = col.plan_wave(state, 1, wave)
        if plan.empty:
            break
        assert plan_index(state).depth_counts(state) == counted_over_every_tree(state)
        state = run(col.run_wave(state, plan))
        waves += 1
    assert waves >= 2
    assert plan_index(state).depth_counts(state) == counted_over_every_tree(state)
    assert phase_starts(state, 1, {}) == {d: n for (p, d), n in counted_over_every_tree(state)[1].items() if p == 1}
