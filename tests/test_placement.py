"""Where the collector runs the search's pure calls (:mod:`focus.placement`): inline on the
event loop when the work they will do is small, in a worker thread when it is large
(the first rankings after the evidence, a refit), and the same batch either way."""

from __future__ import annotations

import math
import pickle
import threading
from typing import Any

import pytest

import focus.placement
from focus.critic import ConstantCritic
from focus.placement import INLINE_S, placed, plan_s, ranking_s, warm_start_s
from focus.search import plan_begin, plan_choose, plan_chosen, plan_lead, plan_next, plan_rank, ranking_work
from focus.testing import run
from tests.test_search_planning import PINNED, collection, digest, jobs
from tests.test_wave_lead import many_tasks


def where(cost_s: float) -> tuple[str, int]:
    """The thread ``placed`` ran a call of ``cost_s`` in, and the call's result."""

    def call(x: int) -> tuple[str, int]:
        return threading.current_thread().name, x + 1

    async def go() -> tuple[str, str, int]:
        name, out = await placed(cost_s, call, 41)
        return threading.current_thread().name, name, out

    loop, ran, out = run(go())
    return ("loop" if ran == loop else "thread"), out


def test_a_short_call_runs_on_the_loop_and_a_long_one_in_a_thread() -> None:
    assert where(0.0) == ("loop", 42)
    assert where(INLINE_S) == ("loop", 42)
    assert where(INLINE_S * 1.01) == ("thread", 42)
    assert where(math.inf) == ("thread", 42)


def test_an_exception_comes_back_the_same_from_either_place() -> None:
    def boom() -> None:
        raise KeyError("x")

    for cost in (0.0, math.inf):
        with pytest.raises(KeyError, match="x"):
            run(placed(cost, boom))


class _Trainable(ConstantCritic):
    fitted = False

    def fit(self, rows: Any) -> None:
        self.fitted = True


def test_the_estimates_follow_the_work() -> None:
    col, tasks = collection("selective", 0)
    search = col.priority
    state = run(col.run_evidence(tasks))
    # after the evidence the calibration is to be fitted and every tree ranked: the thread
    assert ranking_s(state, search) == math.inf and plan_s(state, search, 1) == math.inf
    nxt = plan_next(state, search, 1)  # fits and ranks every tree
    assert nxt.planned and ranking_s(nxt, search) <= INLINE_S
    # waves_in_flight planned: plan_next returns its input, nothing to do
    assert len(nxt.planned) >= search.waves_in_flight and plan_s(nxt, search, 1) == 0.0
    # a state read back from a pickle has no fit cached: telling the work fits nothing
    back = pickle.loads(pickle.dumps(nxt))
    assert ranking_s(back, search) == math.inf and not back._calibrations
    # a wave grafted and scored (not ranked ahead here): its trees' changed nodes, no rebuild
    grown = run(col.run_wave(nxt, nxt.planned[0]))
    work = ranking_work(grown, search)
    assert not work.fit and work.fresh == 0 and work.changed > 0
    assert warm_start_s(ConstantCritic(0.0)) == 0.0 and warm_start_s(_Trainable(0.0)) == math.inf


def test_a_collection_ranks_first_in_a_thread_the_rest_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    col, tasks = many_tasks(1)
    threaded: list[str] = []
    off_loop = focus.placement.off_loop

    async def spy(fn: Any, *args: Any) -> Any:
        threaded.append(fn.__name__)
        return await off_loop(fn, *args)

    monkeypatch.setattr(focus.placement, "off_loop", spy)
    batch = run(col.collect(tasks))
    # the first rankings (after the evidence, at a refit) in the thread, nothing else
    assert threaded and set(threaded) == {"plan_rank"}
    monkeypatch.setattr(focus.placement, "INLINE_S", math.inf)  # every call on the loop
    assert digest(run(col.collect(tasks))) == digest(batch)


@pytest.mark.parametrize("inline_s", [-1.0, math.inf])
def test_the_pinned_batch_wherever_the_calls_run(inline_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(focus.placement, "INLINE_S", inline_s)  # every call in a thread / on the loop
    for kind in ("selective", "uniform"):
        col, tasks = collection(kind, 0)
        batch = run(col.collect(tasks))
        assert (digest(batch), len(batch.actor), len(batch.critic)) == PINNED[(kind, 0)]


def test_the_lead_never_ranks_and_the_wave_is_plan_nexts() -> None:
    col, tasks = many_tasks(1)
    search = col.priority
    state = run(col.run_evidence(tasks))
    choice = plan_begin(state, search, 1)
    assert choice is not None
    got = []
    while len(got) < 10**4:
        jobs_ = plan_lead(choice, 3)
        got.extend(jobs_)
        if not jobs_:
            break
    assert got and choice.lead == len(got) and not choice.ranked  # the picks, no ranking
    assert plan_lead(choice, 3) == []  # over
    if not choice.done:
        assert choice.ranks_next
        plan_rank(choice)
        while not choice.done:
            got.extend(plan_choose(choice, 3))
    chosen = plan_chosen(choice)
    assert jobs(chosen.planned[-1]) == jobs(plan_next(state, search, 1).planned[-1])
    assert [j.seed for j in got] == [j.seed for j in chosen.planned[-1].jobs]
