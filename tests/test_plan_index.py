"""The plan index (:mod:`focus.search.heads`): a plan reads the trees changed since the
last plan and those it takes jobs from, not every tree, and plans exactly what it
plans from the same trees without the index; a replay builds the same index."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from focus.collector import Running
from focus.placement import choice_s
from focus.priority import Priority
from focus.search import SearchState, WaveRecord, last_wave, plan_next, replay, unscored
from focus.search.heads import PlanIndex, plan_index
from focus.search.planning import _Greedy
from focus.search.work import ranking_work
from focus.testing import run
from tests.test_search_planning import collection, fresh
from tests.test_wave_lead import many_tasks


def plan_of(state: SearchState) -> list[tuple[int, int, int, int, float]]:
    p = state.planned[-1]
    return [(j.tree_index, j.node_id, j.seed, j.branch, e) for j, e in zip(p.jobs, p.expected, strict=True)]


def index_of(state: SearchState, search: Priority, phase_index: int) -> tuple[object, ...]:
    """What ``state``'s index holds, brought up to date: heads, spent totals, unscored trees."""
    index = plan_index(state)
    heads = list(index.ranked_heads(state, search, state.calibration(search), phase_index))
    index.spent_total(state, phase_index)
    return heads, dict(index.totals), index.unscored_trees(state)


def test_a_plan_reads_the_trees_changed_since_the_last_plan_and_those_it_takes_jobs_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every plan read every tree (its facts, its ranking head, its budget spent): 26 ms
    a wave at 2,000 tasks whatever the wave touched. Off a refit, a plan now reads the
    trees the last wave changed and the trees it takes jobs from (or, under the
    depth-share bound, holds a checkpoint of back); so do the budget
    check, the scoring's list of unscored nodes and the placement's estimate."""
    col, tasks = many_tasks(1, tasks=60)
    search = col.priority
    state = run(col.run_evidence(tasks))
    read: list[int] = []
    facts = SearchState.facts

    def counting(self: SearchState, tree_index: int):  # type: ignore[no-untyped-def]
        read.append(tree_index)
        return facts(self, tree_index)

    monkeypatch.setattr(SearchState, "facts", counting)
    # the trees whose checkpoints the greedy choice considered: those it took jobs from
    # and, under the depth-share bound (Selective.depth_share), those it held back
    considered: set[int] = set()
    pop = _Greedy._next

    def popping(self: _Greedy, heap: list[Any], at: int) -> Any:
        popped = pop(self, heap, at)
        if popped is not None:
            considered.add(popped[0][2])
        return popped

    monkeypatch.setattr(_Greedy, "_next", popping)
    calib, touched, narrow = None, set(range(len(tasks))), 0
    while True:
        work = ranking_work(state, search)  # what the placement's estimate reads (choice_s)
        assert work.fit or work.trees <= len(touched)
        choice_s(state, search)
        read.clear()
        considered.clear()
        nxt = plan_next(state, search, 1)
        reads = set(read)
        if nxt is state:
            break
        plan = nxt.planned[-1]
        first, refit = calib is None, state.calibration(search) is not calib
        calib = state.calibration(search)
        jobs = {j.tree_index for j in plan.jobs}
        if not refit:  # (the first plan and a refit rank every tree)
            assert reads <= touched | considered and len(reads - (considered - jobs)) < len(tasks) // 2
            narrow += 1
        read.clear()
        last_wave(nxt, search, plan)
        assert not read  # the plan brought the budget spent up to date
        grafted = run(col.run_rollouts(nxt, plan))  # (a graft that may refit reads every tree ahead)
        read.clear()
        todo = unscored(grafted)
        if not first:  # (the first list of unscored nodes reads every tree)
            assert set(read) <= touched | jobs and {ti for ti, _ in todo} <= jobs
        state = run(col.score(grafted))
        touched = jobs
    assert narrow >= 10


@pytest.mark.parametrize(
    ("kind", "seed"), [("selective", 0), ("selective", 5), ("uniform", 2), ("selective_jobs", 1), ("grpo", 3)]
)
def test_every_plan_with_the_index_is_the_plan_without_it(kind: str, seed: int) -> None:
    col, tasks = collection(kind, seed)
    search = col.priority
    state = run(col.run_evidence(tasks))
    waves = 0
    for p in range(1, len(search.phases)):
        while True:
            nxt = plan_next(state, search, p)
            scratch = plan_next(fresh(state), search, p)
            if nxt is state:
                assert not scratch.planned
                break
            assert plan_of(nxt) == plan_of(scratch)
            assert index_of(nxt, search, p) == index_of(fresh(nxt), search, p)
            state = run(col.run_wave(nxt, nxt.planned[0]))
            waves += 1
    assert waves >= 5


def test_with_waves_planned_ahead_and_a_replay_the_index_is_the_one_built_from_scratch() -> None:
    """Waves in flight put checkpoints of many trees in ``pending`` (their trees' heads
    read from their rankings); the state a replay rebuilds holds the same index."""
    col, tasks = many_tasks(2, tasks=30)
    search = col.priority

    async def live():  # type: ignore[no-untyped-def]
        state = await col.run_evidence(tasks)
        start, records, seen, ahead = state, [], [], 0
        running = Running()
        while True:
            if state.waves and len(state.planned) < search.waves_in_flight:
                nxt = plan_next(state, search, 1)  # what the collector's launch_ahead plans
                if nxt is not state:
                    assert plan_of(nxt) == plan_of(plan_next(scratch(state), search, 1))
                    ahead += bool(state.planned)
                    state = nxt
            state, done = await col.advance(state, 1, running)
            if done is None:
                break
            preds = await col.predict(state)
            state = await col.score(state)
            records.append(WaveRecord(1, done.plan.wave_index, done.rollouts, done.wall_s, preds))
            seen.append(index_of(state, search, 1))
        return start, records, seen, ahead

    start, records, seen, ahead = run(live())
    assert len(records) >= 8 and ahead >= 6
    for k in (1, len(records) // 2, len(records)):
        again = replay(start, search, records[:k])
        assert index_of(again, search, 1) == seen[k - 1] == index_of(fresh(again), search, 1)


def scratch(state: SearchState) -> SearchState:
    """The same trees and planned waves in a state that has derived nothing yet."""
    return SearchState(state.collection_id, state.seed, state.tasks, state.trees, list(state.waves), state.planned)


def test_an_index_is_not_pickled_and_a_tree_changed_in_place_is_read_again() -> None:
    col, tasks = collection("uniform", 1)
    search = col.priority
    state = plan_next(run(col.run_evidence(tasks)), search, 1)
    assert isinstance(state._index, PlanIndex)
    assert pickle.loads(pickle.dumps(state))._index is None
    tree = state.trees[0]
    tree.add_node(0, (), "terminal", steps=0, rollout=tree.rollouts)
    tree.rollouts += 1
    state.facts(0)  # its facts notice: the index reads the tree again
    assert 0 in state._index.unranked and 0 in state._index.unspent
