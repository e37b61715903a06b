"""Work on a wave's trees done while the wave runs (focus.waves.WaveTail): each tree
grafted as soon as its jobs finish, scored and ranked too with a row-wise critic. It
must change nothing: the same journal (rollouts, predictions in the same order) and the
same batch as grafting and scoring the whole wave at its barrier."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest

import focus.waves
from focus.agent import Agent
from focus.collector import Collector
from focus.env import Task
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.journal import MemoryJournal
from focus.priority import Phase, Selective
from focus.ranking import TreeRanking
from focus.search import REFIT_LAG, graft, graft_tree, last_wave, plan_ahead, score_tree, unscored, with_predictions
from focus.synthetic import SHAPES, SyntheticCritic, SyntheticEnv, SyntheticPolicy, synthetic_format


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class _SlowPolicy(SyntheticPolicy):
    """Answers after a delay drawn from the call's seed, so a wave's rollouts finish in
    an order unrelated to their jobs' and trees finish while others still run."""

    def __init__(self, mdps: Any) -> None:
        super().__init__(mdps)
        self.in_flight = 0

    async def sample(self, prompt_ids: Any, params: Any) -> Any:
        self.in_flight += 1
        try:
            await asyncio.sleep(random.Random(params.seed).random() * 0.004)
            return await super().sample(prompt_ids, params)
        finally:
            self.in_flight -= 1


class _AllAtOnce(Execution):
    """Returns a wave's rollouts only all at once (as a remote execution service does):
    nothing is grafted before the barrier."""

    async def run(self, agent, jobs):  # type: ignore[no-untyped-def]
        return await super().run(agent, jobs)


class _Batched(SyntheticCritic):
    row_wise = False  # type: ignore[misc]


def _collector(
    execution: Execution, critic_cls: type, waves_in_flight: int, seed: int = 3
) -> tuple[Collector, list[Task]]:
    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long"] * 3)]
    agent = Agent(_SlowPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    search = Selective(
        phases=(
            Phase("evidence", rollouts_per_task=2, max_depth=0),
            Phase("continue", transitions=160, wave_size=6, max_branches=3, max_depth=6),
        ),
        waves_in_flight=waves_in_flight,
    )
    col = Collector(
        agent, search, critic_cls(mdps, 0.15, report_std=True), DirectBranchTd(), execution,
        collection_id="tail", seed=seed,
    )  # fmt: skip
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(len(mdps))]


def _collect(col: Collector, tasks: list[Task]) -> tuple[Any, dict[Any, Any]]:
    journal = MemoryJournal()
    state = run(col.search(tasks, journal))
    return col.prepare(state), journal.steps


@pytest.mark.parametrize(
    ("critic_cls", "waves_in_flight", "lag_spreads"),
    [
        (SyntheticCritic, 1, None),
        (SyntheticCritic, 2, None),
        (_Batched, 1, None),
        (SyntheticCritic, 1, 0),
        (SyntheticCritic, 2, 0),
    ],
)
def test_grafting_ahead_changes_neither_the_journal_nor_the_batch(
    critic_cls: type, waves_in_flight: int, lag_spreads: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if lag_spreads is not None:  # refits lagged from the first fit on (REFIT_LAG): ranked ahead under the next fit
        import focus.search.state as search_state

        monkeypatch.setattr(search_state, "LAG_SPREADS", lag_spreads)
    grafted_while_running, scored = [], []
    real_graft_tree, real_score_tree = focus.waves.graft_tree, focus.waves.score_tree

    def spy_graft_tree(*args):  # type: ignore[no-untyped-def]
        grafted_while_running.append(policy.in_flight > 0)
        return real_graft_tree(*args)

    def spy_score_tree(*args):  # type: ignore[no-untyped-def]
        scored.append((args[2].phase_index, args[4]))  # the part's phase, whether it is ranked
        return real_score_tree(*args)

    monkeypatch.setattr(focus.waves, "graft_tree", spy_graft_tree)
    monkeypatch.setattr(focus.waves, "score_tree", spy_score_tree)
    col, tasks = _collector(Execution(max_concurrency=4), critic_cls, waves_in_flight)
    policy = col.agent.policy
    ahead, ahead_steps = _collect(col, tasks)
    # the incremental path ran, part of it while rollouts of the wave were in flight
    assert sum(grafted_while_running) >= 5
    assert (len(scored) > 0) == critic_cls.row_wise
    if critic_cls.row_wise:  # evidence trees scored as they finish, not ranked; continuations ranked
        # (but not those left once a wave that may refit the calibration has finished)
        assert {(0, False), (1, True)} <= set(scored) <= {(0, False), (1, True), (1, False)}
    grafted_while_running.clear()
    barrier, barrier_steps = _collect(*_collector(_AllAtOnce(max_concurrency=4), critic_cls, waves_in_flight))
    assert not grafted_while_running
    assert ahead.actor == barrier.actor and ahead.critic == barrier.critic
    assert list(ahead_steps) == list(barrier_steps)
    for step, value in ahead_steps.items():
        other = barrier_steps[step]
        if isinstance(value, dict):  # a wave's predictions: same nodes, same order, same scores
            assert list(value.items()) == list(other.items())
        elif hasattr(value, "rollouts"):  # the same rollouts (their elapsed times aside)
            assert [r.pieces for r in value.rollouts] == [r.pieces for r in other.rollouts]


def test_graft_tree_and_score_tree_make_the_state_graft_and_with_predictions_make() -> None:
    """Per tree, in any order, then merged: the trees, records, unscored nodes,
    rankings and the next plan of grafting and scoring the whole wave at once."""

    def wave() -> tuple[Collector, Any, Any, list[Any]]:  # a state with a wave planned, and its rollouts
        col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)

        async def go() -> tuple[Any, Any, list[Any]]:
            state = await col.run_evidence(tasks)
            state = plan_ahead(state, col.priority, 1)
            state = await col.score((await col.land(state, col.launch(state.planned[0])))[0])
            state = plan_ahead(state, col.priority, 1)
            plan = state.planned[0]
            return state, plan, await Execution(max_concurrency=4).run(col.agent, list(plan.jobs))

        return (col, *run(go()))

    col, state, plan, rollouts = wave()
    _, twin, twin_plan, twin_rollouts = wave()
    assert twin_plan.jobs == plan.jobs and [r.pieces for r in twin_rollouts] == [r.pieces for r in rollouts]
    search = col.priority
    whole = graft(state, plan, rollouts, "continue", 1.25)
    preds = run(col.predict(whole))
    whole = with_predictions(whole, preds)

    trees = sorted({j.tree_index for j in plan.jobs})
    random.Random(0).shuffle(trees)
    parts = {}
    for ti in trees:
        own = [r for j, r in zip(plan.jobs, rollouts, strict=True) if j.tree_index == ti]
        part = graft_tree(twin, twin_plan, ti, own, "continue")
        mine = {k: v for k, v in preds.items() if k[0] == ti}
        assert part.unscored == list(mine)
        parts[ti] = score_tree(twin, search, part, mine)
    merged = graft(twin, twin_plan, rollouts, "continue", 1.25, ahead=parts)

    assert merged.waves == whole.waves and merged.planned == whole.planned
    assert unscored(merged) == unscored(whole) == []
    this = (1, plan.wave_index)
    for a, b in zip(merged.trees, whole.trees, strict=True):
        assert a.nodes == b.nodes and a.edges == b.edges and a.states == b.states
        # the records of earlier waves differ in elapsed times only (two runs); this wave's are equal
        assert [(r.rollout, r.phase, r.wave, r.node, r.branch, r.seed) for r in a.log] == [
            (r.rollout, r.phase, r.wave, r.node, r.branch, r.seed) for r in b.log
        ]
        assert [r for r in a.log if (r.phase, r.wave) == this] == [r for r in b.log if (r.phase, r.wave) == this]
    assert {r.wave_wall_s for t in merged.trees for r in t.log if (r.phase, r.wave) == this} == {1.25}
    calib = merged.calibration(search)
    assert calib == whole.calibration(search)
    for ti in trees:  # ranked ahead, equal to a ranking built from scratch on the merged tree
        facts = merged.facts(ti)
        assert facts.rank is not None and not facts.changed
        fresh = TreeRanking(merged.trees[ti], ti, search, calib, merged.seed)
        assert facts.ranked(search, calib, 1, merged.seed) == fresh.ranked(merged.trees[ti], 1)
    nxt, want = plan_ahead(merged, search, 1).planned, plan_ahead(whole, search, 1).planned
    assert [p.jobs for p in nxt] == [p.jobs for p in want] and [p.expected for p in nxt] == [p.expected for p in want]


def test_parts_of_another_tree_or_wave_are_refused() -> None:
    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)

    async def go() -> tuple[Any, Any, list[Any]]:
        state = plan_ahead(await col.run_evidence(tasks), col.priority, 1)
        plan = state.planned[0]
        return state, plan, await Execution(max_concurrency=4).run(col.agent, list(plan.jobs))

    state, plan, rollouts = run(go())
    ti = plan.jobs[0].tree_index
    own = [r for j, r in zip(plan.jobs, rollouts, strict=True) if j.tree_index == ti]
    with pytest.raises(ValueError, match="jobs in the wave"):
        graft_tree(state, plan, ti, own[:-1])
    part = graft_tree(state, plan, ti, own)
    with pytest.raises(ValueError, match="given to tree"):
        score_tree(state, col.priority, part, {(ti + 1, 0): (0.0, None)})
    other = next(t for t in range(len(state.trees)) if t != ti)
    with pytest.raises(ValueError, match="another wave or tree"):
        graft(state, plan, rollouts, "continue", 0.0, ahead={other: part})
    with pytest.raises(ValueError, match="not tree"):  # positions of another tree's jobs
        graft_tree(state, plan, ti, own[:1], jobs=[next(i for i, j in enumerate(plan.jobs) if j.tree_index != ti)])
    if len(own) > 1:  # a part made of some of the tree's jobs only
        short = graft_tree(
            state, plan, ti, own[:1], jobs=[i for i, j in enumerate(plan.jobs) if j.tree_index == ti][:1]
        )
        with pytest.raises(ValueError, match="grafted ahead with 1 of its"):
            graft(state, plan, rollouts, "continue", 0.0, ahead={ti: short})


def test_merged_predictions_are_in_the_order_one_call_makes_them() -> None:
    ahead = {(2, 5): (0.1, None), (2, 7): (0.2, None), (0, 3): (0.3, 0.1)}
    rest = {(1, 4): (0.4, None), (3, 1): (0.5, None)}
    merged = focus.waves.merged_predictions(ahead, rest)
    assert list(merged) == [(0, 3), (1, 4), (2, 5), (2, 7), (3, 1)] and merged[(0, 3)] == (0.3, 0.1)


def test_an_execution_that_returns_a_wave_whole_reports_its_jobs_at_the_end() -> None:
    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)

    async def go() -> tuple[list[Any], list[tuple[int, Any]], list[tuple[int, Any]]]:
        state = plan_ahead(await col.run_evidence(tasks), col.priority, 1)
        jobs = list(state.planned[0].jobs)
        whole: list[tuple[int, Any]] = []
        each: list[tuple[int, Any]] = []
        out = await _AllAtOnce(max_concurrency=4).run_reporting(col.agent, jobs, lambda i, r: whole.append((i, r)))
        await Execution(max_concurrency=4).run_reporting(col.agent, jobs, lambda i, r: each.append((i, r)))
        return out, whole, each

    out, whole, each = run(go())
    assert not _AllAtOnce().reports_jobs and Execution().reports_jobs
    assert [i for i, _ in whole] == list(range(len(out))) and all(r is out[i] for i, r in whole)
    assert sorted(i for i, _ in each) == list(range(len(out)))  # as each finished, every job once


def test_the_calibration_reads_the_parts_the_tail_computed() -> None:
    """The noise rows, counts and spreads of every tree are computed while a wave that
    may refit the calibration runs (here the evidence, scored as it finishes), and the fit
    that joins them is the fit of the whole collection from scratch."""
    import numpy as np

    from focus.calibration import calibrate
    from focus.noise_rows import coefficients, collect, joined, tree_rows

    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)
    search = col.priority
    state = run(col.run_evidence(tasks))
    assert len(state.waves) == 1
    g, rule = search.discount, search.truncation_rule
    for ti in range(len(state.trees)):
        facts = state._derived[ti]  # made in the tail, before any calibration was asked for
        assert (g, rule) in facts._rows and rule in facts.shape and "spreads" in facts.shape
        assert ("segments", g) in facts._ahead and ("ties", state.seed) in facts._ahead
    assert not state._calibrations
    calib = state.calibration(search)
    assert calib == calibrate(state.trees, gamma=g, truncation=rule)
    # the first rankings, built on the segments and tie-breaks computed ahead, and rankings
    # rebuilt for another calibration on their predecessors', are those built from scratch
    other = dataclasses.replace(calib, mean_tokens=2.5 * calib.mean_tokens)
    for c in (calib, other):
        for ti, tree in enumerate(state.trees):
            got = state.facts(ti).ranked(search, c, 1, state.seed)
            assert got == TreeRanking(tree, ti, search, c, state.seed).ranked(tree, 1) and got
            assert not state.facts(ti)._ahead
    # trees' rows joined (child references shifted) are the rows of one pass over all trees
    one: list[Any] = []
    for tree in state.trees:
        collect(tree, g, rule, None, one)
    recs, bases = joined([tree_rows(t, g, rule) for t in state.trees])
    nd = max(r.depth for r in recs) + 1
    whole, parts = coefficients(one, nd), coefficients(recs, nd, bases)
    assert np.array_equal(whole[0], parts[0]) and np.array_equal(whole[1], parts[1])
    assert all(np.array_equal(a, b) for a, b in zip(whole[2], parts[2], strict=True))
    assert state.spread_count(1) == sum(1 for r in one if r.m >= 2) > 0
    # refits come only at powers of two of waves, once the spreads can have doubled
    spreads = state.spread_count(1)
    later = [state.may_refit(search, spreads)]
    for n in range(2, 9):
        state.waves.append((1, n - 2))
        later.append(state.may_refit(search, spreads))
    assert later == [True, False, True, False, False, False, True, False]
    assert not state.may_refit(search, spreads - 1)  # a wave too small to double them


@pytest.mark.parametrize("lag_spreads", [1 << 30, 0])
def test_a_refit_lags_its_waves_once_the_fit_rests_on_many_spreads(
    lag_spreads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With spreads doubling every wave, the fit moves at powers of two of waves; once
    the fit in use rests on LAG_SPREADS spreads it moves a wave later (REFIT_LAG), and
    the next graft's fit is then known before it (``next_calibration``), where an
    unlagged one may read the graft's own wave (``None``)."""
    import focus.search.state as search_state

    monkeypatch.setattr(search_state, "LAG_SPREADS", lag_spreads)
    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)
    search = col.priority
    state = run(col.run_evidence(tasks))
    state._spreads.update({k: state.spread_count(1) << (k - 1) for k in range(2, 10)})  # doubling every wave
    sizes, nexts, known = [], [], []
    for n in range(1, 10):
        sizes.append(state._fit_size(search))
        nexts.append(state.refits_next(search))
        known.append(state.next_calibration(search) is not None)
        state.waves.append((1, n - 1))
    if lag_spreads:
        assert sizes == [1, 2, 2, 4, 4, 4, 4, 8, 8] and not any(nexts)
        assert known == [False, True, False, True, True, True, False, True, True]  # (at 1, 3, 7: the graft's own wave)
    else:
        assert sizes == [1, 1, 2, 2, 4, 4, 4, 4, 8] and REFIT_LAG == 1
        assert nexts == [False, True, False, True, False, False, False, True, False] and all(known)


def test_a_wave_that_ends_the_search_is_scored_ahead_but_not_ranked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trees of a wave expected to end the search (:func:`focus.search.last_wave`:
    the waves planned cover what is left of the last phase's budget) are scored as they
    finish but not ranked, since no plan reads those rankings; the waves before it are
    ranked, and nothing is planned after it. The batch is the barrier's either way
    (:func:`test_grafting_ahead_changes_neither_the_journal_nor_the_batch`)."""
    import focus.collector
    from focus.search import WavePlan

    seen: list[tuple[int, bool]] = []
    ranked: dict[int, set[bool]] = {}
    real_last, real_score = focus.collector.last_wave, focus.waves.score_tree

    def spy_last(state, search, plan):  # type: ignore[no-untyped-def]
        out = real_last(state, search, plan)
        seen.append((plan.wave_index, out))
        return out

    def spy_score(*args):  # type: ignore[no-untyped-def]
        if args[2].phase_index == 1:
            ranked.setdefault(args[2].wave_index, set()).add(args[4])
        return real_score(*args)

    monkeypatch.setattr(focus.collector, "last_wave", spy_last)
    monkeypatch.setattr(focus.waves, "score_tree", spy_score)
    # seed 6: a collection of 8 waves
    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1, seed=6)
    state = run(col.search(tasks))
    continuation = [(w, out) for w, out in seen if w in ranked]
    *before, (last, ends) = continuation
    assert len(before) >= 3 and not any(out for _, out in before) and ends
    assert ranked[last] == {False} and all(True in ranked[w] for w, _ in before[:1])
    assert not plan_ahead(state, col.priority, 1).planned  # nothing after it
    assert not last_wave(state, col.priority, WavePlan(0, 0))  # an evidence wave
    # the tail computed what the batch's noise fit reads of the trees (their rows), not
    # what only a plan reads (draws)
    g, rule = col.priority.discount, col.priority.truncation_rule
    touched = [ti for ti, t in enumerate(state.trees) if any(r.phase == 1 and r.wave == last for r in t.log)]
    assert touched and all((g, rule) in state.facts(ti)._rows for ti in range(len(state.trees)))
    assert not any("draws" in state.facts(ti).shape for ti in touched)


def test_a_wave_whose_graft_refits_is_not_ranked_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wave whose graft fits a new calibration ranks none of its trees ahead (the plan
    ranks every tree again under the new one), told as its trees come in
    (:meth:`focus.search.SearchState.refit_floor`: the graft refits exactly when the
    spreads reach it); the waves that do not refit rank theirs. The batch is the
    barrier's either way (:func:`test_grafting_ahead_changes_neither_the_journal_nor_the_batch`)."""
    import focus.collector

    ranked: dict[int, list[bool]] = {}
    refits: dict[int, bool] = {}
    real_land, real_score = focus.collector.Collector.land, focus.waves.score_tree

    async def spy_land(self, state, launched, *args, **kw):  # type: ignore[no-untyped-def]
        plan, search = launched.plan, self.priority
        floor = state.refit_floor(search) if plan.phase_index == 1 else None
        new, landed = await real_land(self, state, launched, *args, **kw)
        if plan.phase_index == 1:
            refit = new.calibration(search) is not state.calibration(search)
            assert refit == (floor is not None and new.spread_count(len(new.waves)) >= floor)
            refits[plan.wave_index] = refit
        return new, landed

    def spy_score(*args):  # type: ignore[no-untyped-def]
        if args[2].phase_index == 1:
            ranked.setdefault(args[2].wave_index, []).append(args[4])
        return real_score(*args)

    monkeypatch.setattr(focus.collector.Collector, "land", spy_land)
    monkeypatch.setattr(focus.waves, "score_tree", spy_score)
    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)
    run(col.search(tasks))
    assert any(refits.values()) and not all(refits.values())
    assert any(ranked.get(w) for w, refit in refits.items() if refit)  # trees scored ahead in a refit wave
    for wave, refit in refits.items():
        if refit:
            assert not any(ranked.get(wave, []))


def test_a_wave_whose_graft_brings_in_a_lagged_refit_ranks_its_trees_under_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lagged refit (:data:`focus.search.REFIT_LAG`, here from the first fit on:
    LAG_SPREADS 0) is known when its wave starts (:meth:`focus.search.SearchState.refits_next`):
    the tail fits it on the waves before the wave and ranks the trees it scores under it,
    and the new state takes that fit over instead of fitting again; a wave whose graft
    keeps the calibration ranks under the one it has. The batch is the barrier's either
    way (:func:`test_grafting_ahead_changes_neither_the_journal_nor_the_batch`, lagged too)."""
    import focus.collector
    import focus.search.state as search_state

    monkeypatch.setattr(search_state, "LAG_SPREADS", 0)
    ranked: dict[int, list[Any]] = {}
    refits: dict[int, bool] = {}
    real_land, real_score = focus.collector.Collector.land, focus.waves.score_tree

    async def spy_land(self, state, launched, *args, **kw):  # type: ignore[no-untyped-def]
        plan, search = launched.plan, self.priority
        refit = plan.phase_index == 1 and state.refits_next(search)
        new, landed = await real_land(self, state, launched, *args, **kw)
        if plan.phase_index == 1 and not last_wave(state, search, plan):
            calib = new.calibration(search)
            assert (calib is not state.calibration(search)) == refit
            assert calib is state.next_calibration(search)  # fitted before the graft, taken over
            if refit:
                assert new._fit_size(search) == len(state.waves)  # the waves before this one
            refits[plan.wave_index] = refit
            assert all(c is calib for c in ranked.get(plan.wave_index, []))
        return new, landed

    def spy_score(*args):  # type: ignore[no-untyped-def]
        if args[2].phase_index == 1 and args[4]:
            ranked.setdefault(args[2].wave_index, []).append(args[5])
        return real_score(*args)

    monkeypatch.setattr(focus.collector.Collector, "land", spy_land)
    monkeypatch.setattr(focus.waves, "score_tree", spy_score)
    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)
    run(col.search(tasks))
    assert any(refits.values()) and not all(refits.values())
    assert any(ranked.get(w) for w, refit in refits.items() if refit)  # trees ranked ahead in a refit wave


def test_what_the_tail_computed_ahead_of_a_first_ranking_outlives_a_rescore_and_a_graft(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The segments and tie-breaks the tail computes ahead of a tree's first ranking
    (``_TreeFacts.prefit``) pass to the tree's next form, scored or grafted again before
    that ranking (as the evidence wave's trees are: grafted, then scored, as they finish):
    over a whole collection every edge's segment is computed once (at 40k transitions over
    800 tasks, 9,117 of 49,599 were computed again), and the batch is the same."""
    import focus.ranking
    import focus.search.state
    from focus.segments import segment

    made: dict[tuple[int, int], int] = {}
    kept: list[Any] = []  # the edges' turns stay alive: their ids are not reused

    def counted(e: Any, gamma: float) -> Any:
        kept.append(e.turns)
        made[(id(e.turns), e.child)] = made.get((id(e.turns), e.child), 0) + 1
        return segment(e, gamma)

    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)
    batch, _ = _collect(col, tasks)
    for mod in (focus.ranking, focus.search.state):
        monkeypatch.setattr(mod, "segment", counted)
    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)
    again, _ = _collect(col, tasks)
    assert made and max(made.values()) == 1, sorted(made.values())[-5:]
    assert again.actor_table.equals(batch.actor_table) and again.critic_table.equals(batch.critic_table)
    # a state scored again hands them over: the new facts hold them, the old ones none
    col, tasks = _collector(Execution(max_concurrency=4), SyntheticCritic, 1)
    state = run(col.run_evidence(tasks))
    ti, nid = 0, next(n.id for n in state.trees[0].checkpoints())
    before = state._derived[ti]._ahead
    assert before and ("segments", col.priority.discount) in before
    later = with_predictions(state, {(ti, nid): (0.25, None)})
    assert later.facts(ti)._ahead is before and not state._derived[ti]._ahead
