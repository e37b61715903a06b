"""A wave's leading exploration picks (:class:`focus.search.planning._Greedy`): taken
from the trees as they are, before the calibration is fitted or any tree ranked, and
the same jobs, in the same order, as the greedy choice over every checkpoint's view."""

from __future__ import annotations

import collections
import heapq
from typing import Any

import pytest

import focus.calibration
import focus.waves
from focus.agent import Agent
from focus.collector import Collector
from focus.env import Task
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.priority import EXPLORE, Phase, Selective, explores
from focus.ranking import entry
from focus.search import SearchState, plan_begin, plan_choose, plan_chosen, plan_next, plan_rank
from focus.search.planning import wave_limits
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.testing import run
from tests.test_search_planning import digest


def many_tasks(waves_in_flight: int, tasks: int = 48, explore: float = 0.25) -> tuple[Collector, list[Task]]:
    """Many tasks and small waves: the evidence leaves more exploration draws than a
    wave holds, so whole waves are exploration picks, then partly, then hardly."""
    names = ["uniform", "critical", "long"] * (tasks // 3)
    mdps = [SHAPES[s](i) for i, s in enumerate(names)]
    search = Selective(
        phases=(
            Phase("evidence", rollouts_per_task=2),
            Phase("continue", transitions=500, wave_size=8, max_branches=4, max_depth=8),
        ),
        waves_in_flight=waves_in_flight,
        explore=explore,
    )
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    critic = SyntheticCritic(mdps, 0.15, report_std=True)
    col = Collector(agent, search, critic, DirectBranchTd(), Execution(max_concurrency=8), collection_id="lead", seed=3)
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(len(mdps))]


def reference_wave(state: SearchState, search: Selective, phase_index: int) -> list[tuple[int, int, int, float]]:
    """The greedy choice as its definition reads, over a heap of every eligible
    checkpoint's view (pending counted), each taken one re-ranked: (tree, node, branch,
    expected transitions) per job."""
    phase = search.phases[phase_index]
    calib = state.calibration(search)
    facts = [state.facts(ti) for ti in range(len(state.trees))]
    remaining = (phase.transitions or 0) - sum(f.spent.get(phase_index, 0) for f in facts)
    pending: dict[tuple[int, int], int] = {}
    for p in state.planned:
        remaining -= sum(p.expected)
        for j in p.jobs:
            pending[(j.tree_index, j.node_id)] = pending.get((j.tree_index, j.node_id), 0) + 1
    limit, fill = wave_limits(phase, calib)
    remaining = min(remaining, fill)
    heap = []
    views = {}
    for ti, tree in enumerate(state.trees):
        for node in tree.checkpoints():
            ev = facts[ti].view(search, calib, state.seed, node.id)
            if ev is None or node.id not in tree.states or ev.depth > phase.max_depth:
                continue
            ev = ev.with_pending(pending.get((ti, node.id), 0))
            if ev.branches + ev.pending < phase.max_branches:
                views[(ti, node.id)] = ev
                heap.append(entry(search, state.seed, ev))
    heapq.heapify(heap)
    # the depth-share bound (Selective.depth_share): a depth's continuations of the phase
    # stay within factor x its share of the eligible checkpoints x (N + 1), plus one;
    # exploration picks are counted, never held; where only held ones are left, they go
    # in rank order
    factor = search.depth_share_bound()
    eligible = collections.Counter(
        tree.nodes[n].depth
        for tree in state.trees
        for n in tree.states
        if tree.nodes[n].depth <= phase.max_depth and len(tree.nodes[n].children) < phase.max_branches
    )
    starts = collections.Counter(
        tree.nodes[r.node].depth for tree in state.trees for r in tree.log if r.phase == phase_index
    )
    for (ti, nid), n in pending.items():
        starts[state.trees[ti].nodes[nid].depth] += n
    held: list[Any] = []
    out: list[tuple[int, int, int, float]] = []
    planned = 0.0
    while (heap or held) and len(out) < limit and planned < remaining:
        if not heap:
            heap, held, factor = held, [], 0.0
            heapq.heapify(heap)
        _, _, ti, nid = heapq.heappop(heap)
        ev = views[(ti, nid)]
        d, n = ev.depth, sum(starts.values())
        if factor > 0 and search(ev) != EXPLORE:
            if starts[d] + 1 > factor * eligible[d] / sum(eligible.values()) * (n + 1) + 1:
                held.append(entry(search, state.seed, ev))
                continue
        starts[d] += 1
        out.append((ti, nid, ev.branches + ev.pending, ev.expected_transitions))
        planned += ev.expected_transitions
        ev = views[(ti, nid)] = ev.with_pending(ev.pending + 1)
        if ev.branches + ev.pending < phase.max_branches:
            heapq.heappush(heap, entry(search, state.seed, ev))
    return out


def lead_length(jobs: list[tuple[int, int, int, float]], search: Selective, mean_leaf: float) -> int:
    rate = search.explore / (1.0 + mean_leaf)
    n = 0
    for ti, nid, branch, _ in jobs:
        if not explores(ti, nid, branch, rate):
            break
        n += 1
    return n


@pytest.mark.parametrize("waves_in_flight", [1, 2])
@pytest.mark.parametrize("always_lead", [False, True])
def test_every_wave_is_the_greedy_over_every_view_and_starts_with_its_lead(
    waves_in_flight: int, always_lead: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if always_lead:  # a lead at every wave, not only where the calibration is to be fitted: the same plans
        monkeypatch.setattr(SearchState, "calibrated", lambda self, search: False)
    col, tasks = many_tasks(waves_in_flight)
    search = col.priority
    state = run(col.run_evidence(tasks))
    fits = []
    noise_model = focus.calibration.noise_model
    monkeypatch.setattr(focus.calibration, "noise_model", lambda *a, **k: fits.append(1) or noise_model(*a, **k))
    leads: list[tuple[int, int]] = []
    fitted: list[bool] = []  # whether the wave's calibration was a new fit, for waves with a lead
    for _ in range(40):
        mean_leaf = state.mean_leaf_transitions(search)
        ranked = state.calibrated(search) and all(
            state.facts(ti).built(search, state.calibration(search), state.seed) for ti in range(len(state.trees))
        )
        before = len(fits)
        choice = plan_begin(state, search, 1)
        if choice is None:  # the waves in flight are planned: land the oldest
            state = run(col.run_wave(state, state.planned[0]))
            continue
        first = plan_choose(choice, 10**6)
        lead = choice.lead
        assert lead in (0, len(first))
        if lead:  # the lead came without a fit of the noise model
            assert len(fits) == before
            fitted.append(state.calibration(search) is not None and len(fits) > before)
        if lead and not choice.done:  # and the next call ranks
            assert choice.ranks_next
            plan_rank(choice)
            assert not choice.ranks_next
        while not choice.done:
            plan_choose(choice, 5)
        assert state.calibration(search).mean_leaf_transitions == mean_leaf
        want = reference_wave(state, search, 1)
        chosen = plan_chosen(choice)
        if chosen is state:
            assert not want
            break
        plan = chosen.planned[-1]
        got = [(j.tree_index, j.node_id, j.branch, e) for j, e in zip(plan.jobs, plan.expected, strict=True)]
        assert got == want
        assert plan_next(state, search, 1).planned[-1].jobs == plan.jobs
        if ranked and not always_lead:  # a lead only where trees are to be ranked
            assert lead == 0
        if lead and lead < len(got):  # the lead is every exploration pick before the first ranked one
            assert lead == lead_length(got, search, mean_leaf)
        elif lead:
            assert lead_length(got, search, mean_leaf) == len(got)
        leads.append((lead, len(got)))
        state = chosen
        if len(state.planned) >= waves_in_flight:
            state = run(col.run_wave(state, state.planned[0]))
    # after the evidence, a whole wave of exploration picks, taken before the first fit
    assert leads[0][0] == leads[0][1] > 0 and fitted[0]
    assert len(leads) >= 6
    if always_lead:  # waves that start with a few exploration picks, then the ranked ones
        assert sum(0 < lead < n for lead, n in leads) >= 3


def test_without_exploration_the_first_slice_ranks_as_before() -> None:
    col, tasks = many_tasks(1, tasks=12, explore=0.0)
    state = run(col.run_evidence(tasks))
    choice = plan_begin(state, col.priority, 1)
    assert choice is not None
    got = plan_choose(choice, 3)
    assert len(got) == 3 and not choice.ranks_next
    want = reference_wave(state, col.priority, 1)
    assert [(j.tree_index, j.node_id, j.branch) for j in got] == [w[:3] for w in want[:3]]


def test_a_collector_ranks_while_the_lead_runs_and_collects_the_same_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    col, tasks = many_tasks(1)
    rested: list[bool] = []
    follow = focus.waves.WaveTail.follow

    async def spy(self, state, *args, **kw):  # type: ignore[no-untyped-def]
        rested.append(self.rank_rest)
        return await follow(self, state, *args, **kw)

    monkeypatch.setattr(focus.waves.WaveTail, "follow", spy)
    batch = run(col.collect(tasks))
    # the first continuation wave is all exploration picks (whether later ones are too
    # depends on how far their tails got with the rankings: timing, not the plans)
    assert not rested[0] and rested[1]
    with monkeypatch.context() as m:  # a lead at every wave (ranked off the loop): the same batch
        m.setattr(SearchState, "calibrated", lambda self, search: False)
        again = run(many_tasks(1)[0].collect(tasks))
    assert digest(again) == digest(batch) and len(batch.actor) > 0
