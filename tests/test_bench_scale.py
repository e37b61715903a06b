"""benchmarks/scale.py at quick size: both arms collect their budget and every figure is there."""

from __future__ import annotations

import contextlib
import json

import pytest

from focus.toy import reach_target_tasks

pytestmark = pytest.mark.timeout(300)

ARM_FIGURES = (
    "transitions",
    "rollouts",
    "failed_rollouts",
    "budget_met",
    "wall_s",
    "transitions_per_s",
    "cpu_ms_per_transition",
    "rollout_cpu_ms_per_transition",
    "search_cpu_ms_per_transition",
    "plan_cpu_ms_per_transition",
    "graft_cpu_ms_per_transition",
    "score_cpu_ms_per_transition",
    "prefit_cpu_ms_per_transition",
    "prepare_cpu_ms_per_transition",
    "gc_cpu_ms_per_transition",
    "cpu_ms_per_transition_without_gc",
    "peak_rss_mib",
    "rss_growth_kib_per_transition",
    "server_cpu_ms_per_call",
    "slot_utilisation",
    "idle_share",
    "server_idle_share",
    "server_underfilled_share",
    "main_thread_cpu_s",
    "loop_wait_calls_s",
    "loop_wait_idle_s",
    "other_wait_s",
)
WAVE_FIGURES = (
    "plan_cpu_ms_per_wave_first_quarter",
    "plan_cpu_ms_per_wave_last_quarter",
    "plan_cpu_per_wave_last_vs_first_quarter",
    "jobs_per_wave_first_quarter",
    "jobs_per_wave_last_quarter",
)


def test_expected_rollout_length_matches_the_digit_walk():
    from benchmarks.scale import expected_rollout_transitions

    # one digit 1-9 always reaches a target of 1; a target of 2 needs a second digit when the first is 1
    assert expected_rollout_transitions(1, 16) == pytest.approx(1.0)
    assert expected_rollout_transitions(2, 16) == pytest.approx(1 + 1 / 9)
    assert expected_rollout_transitions(40, 3) == pytest.approx(3.0)  # truncated at max_steps
    # long walks: about target / mean digit (5) plus the overshoot
    assert 6.0 < expected_rollout_transitions(30, 16) < 7.0


def test_server_occupancy_counts_gaps_and_thin_service():
    from benchmarks.scale import server_occupancy

    # (arrived, acquired, done, ...) per request; 4 slots, so "underfilled" is fewer than 2 in service
    log = [
        (0.0, 0.0, 1.0, 1, 5, 0, 3),
        (0.0, 0.5, 1.0, 2, 5, 0, 3),  # queued 0.5 s, then in service beside the first
        (1.0, 1.0, 2.0, 3, 5, 0, 3),  # starts as the first two end: no gap
        (3.0, 3.0, 4.0, 4, 5, 0, 3),  # after 1 s with nothing in the server
    ]
    out = server_occupancy(log, slots=4)
    assert out["server_window_s"] == pytest.approx(4.0)
    assert out["server_idle_share"] == pytest.approx(1 / 4)
    # fewer than 2 in service: 0-0.5, 1-2, 2-3 and 3-4 -> 3.5 s
    assert out["server_underfilled_share"] == pytest.approx(3.5 / 4)
    assert server_occupancy([], slots=4)["server_idle_share"] is None


def test_call_meter_counts_the_stretches_with_no_call_in_flight():
    import asyncio

    from benchmarks.scale import CallMeter

    class Policy:
        async def sample_on_route(self, prompt_ids, params, route):
            await asyncio.sleep(prompt_ids)
            return prompt_ids

    policy = Policy()
    meter = CallMeter().install(policy)

    async def go():
        await asyncio.gather(policy.sample_on_route(0.05, None, ()), policy.sample_on_route(0.1, None, ()))
        await asyncio.sleep(0.2)  # a barrier: nothing in flight
        await policy.sample_on_route(0.05, None, ())

    asyncio.run(go())
    f = meter.figures()
    assert meter.calls == 3 and meter.in_flight == 0
    # the gap is at least the barrier's sleep and the window at least its three parts; the shares
    # are compared loosely, since a loaded machine stretches every sleep
    assert f["idle_s"] >= 0.2 and f["calls_window_s"] >= 0.35
    assert f["idle_share"] == pytest.approx(f["idle_s"] / f["calls_window_s"])
    assert f["idle_s"] < f["calls_window_s"] - 0.15
    (at, length), *_ = f["idle_gaps_ms"]  # the barrier, after the first two calls
    # the gaps are rounded to 0.1 ms, so the longest may read up to 0.05 ms over the total
    assert at >= 100 and 200 <= length <= 1000 * f["idle_s"] + 0.05


def test_wall_meter_splits_the_loop_threads_wall():
    """A loop that computes, sleeps in its selector with a call in flight, then with
    none, and blocks outside the selector: each stretch lands in its own figure."""
    import asyncio
    import selectors
    import time

    from benchmarks.scale import CallMeter, WallMeter

    calls = CallMeter()
    original = selectors.DefaultSelector.select

    async def go() -> None:
        t = time.thread_time()
        while time.thread_time() - t < 0.05:  # CPU
            pass
        calls.in_flight = 1
        await asyncio.sleep(0.1)  # in the selector, a call in flight
        calls.in_flight = 0
        await asyncio.sleep(0.06)  # in the selector, none
        time.sleep(0.08)  # blocked outside the selector

    start = time.perf_counter()
    with WallMeter(calls) as meter:
        asyncio.run(go())
    # what a loaded machine added to the stretches' 0.29 s (a wake-up late by the run
    # queue lands in the stretch it ends): each figure may carry that much more
    slack = max(0.0, time.perf_counter() - start - 0.29) + 0.05
    f = meter.figures()
    assert f["main_thread_cpu_s"] >= 0.05
    # asyncio wakes a sleeper up to its clock's resolution early, and a loaded machine
    # moves part of a wait to the run queue (0.0973 s of 0.1 seen with 6 agents on 2 cores)
    assert 0.1 - 0.01 <= f["loop_wait_calls_s"] < 0.1 + slack
    assert 0.06 - 0.01 <= f["loop_wait_idle_s"] < 0.06 + slack
    # the sleep outside the selector, less what a loaded machine may move to the run queue
    assert 0.08 - (f["runqueue_s"] or 0.0) - 0.01 <= f["other_wait_s"] < 0.08 + slack
    if f["runqueue_s"] is not None:  # Linux
        assert 0 <= f["runqueue_s"] and f["runqueue_share"] < 1
    assert selectors.DefaultSelector.select is original  # put back


def test_search_meter_times_each_thread_on_its_own():
    """Planning runs in a worker thread while the wave's tail runs on the event loop's:
    a call on one thread is not nested in an open call of another, and the tail's
    ``prefit`` (a method, not a public function) is timed as search."""
    import threading

    from benchmarks.scale import SearchMeter
    from focus.search.state import _TreeFacts
    from focus.testing import run
    from tests.test_search_planning import collection

    col, tasks = collection("selective", 0)
    state = run(col.run_evidence(tasks))
    original = _TreeFacts.prefit
    meter = SearchMeter(col.priority).install()
    try:
        inside, release = threading.Event(), threading.Event()

        def plan() -> None:
            inside.set()
            release.wait(10)

        other = threading.Thread(target=meter.measure, args=("plan", plan))
        other.start()
        assert inside.wait(10)
        state.facts(0).prefit(col.priority)  # on this thread, while the other's call is open
        release.set()
        other.join(10)
    finally:
        meter.uninstall()
    assert _TreeFacts.prefit is original
    assert meter.cpu["prefit"] > 0 and meter.cpu["plan"] > 0


def test_rows_budgets_and_task_series():
    from benchmarks.scale import baseline_group_size, expected_task_transitions, focus_search, rows_for

    assert rows_for([2000, 10000], 40, 20) == [(2000, 40, "few"), (10000, 40, "few"), (10000, 200, "many")]
    tasks = reach_target_tasks(40, seed=1, low=20, high=40)
    per_round = expected_task_transitions(tasks, 16)
    search = focus_search(10000, tasks, 16, 512)
    evidence, cont = search.phases
    assert evidence.rollouts_per_task is not None and cont.transitions is not None
    assert evidence.rollouts_per_task * per_round + cont.transitions == pytest.approx(10000, abs=1)
    assert cont.wave_size == 512 and cont.max_branches == 4  # library defaults but the budget and wave size
    k = baseline_group_size(10000, tasks, 16)
    assert k * per_round >= 10000 > (k - 1) * per_round
    with pytest.raises(ValueError, match="evidence phase"):
        focus_search(1000, reach_target_tasks(200, seed=1, low=20, high=40), 16, 512)


class SharedServer:
    """Stands in for ``SimServerProcess`` in the arms run in this process: one server
    process for all of them (every arm's is configured alike), its counters, request log
    and cache emptied as each arm starts, as a fresh server's are."""

    def __init__(self) -> None:
        self.server = None
        self.uses = 0

    def __call__(self, config):  # type: ignore[no-untyped-def]
        from focus.testing.simserver import SimServerProcess

        if self.server is None:
            self.server = SimServerProcess(config).start()
        assert config == self.server.config
        self.server.flush_cache()
        self.server.reset()
        self.uses += 1
        return contextlib.nullcontext(self.server)


@pytest.mark.integration
def test_scale_benchmark_quick_run_reports_every_figure(tmp_path, monkeypatch):
    from benchmarks import scale, scale_arms

    # The first arm runs as the benchmark runs every arm, in a fresh interpreter
    # (``--child``, its figures back through ``--child-out``) with a server process of its
    # own; the other eleven run the same ``run_arm`` in this process, against one server
    # process: the start-up and imports of a fresh interpreter and of a server were most
    # of this test's time
    real_child, arms, shared = scale.run_child, [], SharedServer()

    def run_child(cfg, timeout_s):  # type: ignore[no-untyped-def]
        arms.append(cfg["arm"])
        if len(arms) == 1:
            return real_child(cfg, timeout_s)
        return json.loads(json.dumps(scale.run_arm(cfg)))

    monkeypatch.setattr(scale, "run_child", run_child)
    monkeypatch.setattr(scale_arms, "SimServerProcess", shared)
    out = tmp_path / "scale.json"
    try:
        figures = scale.main(["--quick", "--json", str(out)])
    finally:
        if shared.server is not None:
            shared.server.stop()
    assert sorted(arms) == sorted(["focus", "baseline", "tuned"] * 4) and shared.uses == 11
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(json.dumps(figures))
    keys = [r["key"] for r in figures["rows"]]
    assert keys == ["300_6t", "1k_6t", "1k_20t"]
    # rows up to --repeat-max-size run twice at quick size; the kept run is one of them
    runs = {r["key"]: r["focus_cpu_ms_per_transition_each_run"] for r in figures["rows"]}
    assert [len(v) for v in runs.values()] == [2, 1, 1]
    assert figures["rows"][0]["focus"]["cpu_ms_per_transition"] == min(runs["300_6t"])
    for row in figures["rows"]:
        for arm in ("focus", "baseline", "tuned"):
            f = row[arm]
            missing = [k for k in ARM_FIGURES if f.get(k) is None]
            assert not missing, (row["key"], arm, missing)
            assert f["budget_met"] and f["failed_rollouts"] == 0, (row["key"], arm, f["budget"])
            assert 0.85 * row["transitions_budget"] <= f["transitions"] <= 1.3 * row["transitions_budget"]
            assert f["actor_rows"] == f["model_calls"] == f["transitions"]
            # FOCUS's sibling continuations send their first calls as one request
            # (focus.siblings); the loop's rollouts are seeded apart, one request a call
            sent, calls = f["server_requests"], f["model_calls"]
            assert sent < calls if arm == "focus" else sent == calls, (row["key"], arm, sent, calls)
            assert f["rollout_cpu_ms_per_transition"] > 0 and f["peak_rss_mib"] > 0
            parts = f["rollout_cpu_ms_per_transition"] + f["search_cpu_ms_per_transition"]
            assert parts + f["prepare_cpu_ms_per_transition"] == pytest.approx(f["cpu_ms_per_transition"])
        focus, baseline, tuned = row["focus"], row["baseline"], row["tuned"]
        assert baseline["search_cpu_ms_per_transition"] == 0 and baseline["critic_rows"] == 0
        # the tuned arm is the same loop (same rollouts, same batch) with no cyclic GC inside its clock
        assert tuned["transitions"] == baseline["transitions"] and tuned["actor_rows"] == baseline["actor_rows"]
        assert tuned["gc_full_collections"] == 0
        assert focus["plan_cpu_ms_per_transition"] > 0 and focus["graft_cpu_ms_per_transition"] > 0
        # the refit's per-tree parts computed in the wave's tail count as search, not rollout
        assert focus["prefit_cpu_ms_per_transition"] > 0 and baseline["prefit_cpu_ms_per_transition"] == 0
        assert focus["critic_rows"] > 0
        # the idle shares are shares of a window the calls span
        for f in (focus, baseline):
            assert 0 <= f["idle_share"] <= f["server_idle_share"] + 0.2 and f["server_underfilled_share"] <= 1
            assert 0 < f["calls_window_s"] <= f["wall_s"] and 0 < f["server_window_s"] <= f["wall_s"]
        # every continuation wave is in the per-wave list, in order, with its own costs
        waves = focus["per_wave"]
        assert len(waves) == focus["continuation_waves"] >= 2
        assert [w["wave"] for w in waves] == list(range(len(waves)))
        assert all(w["plan_ms"] > 0 and w["graft_ms"] > 0 and w["jobs"] > 0 for w in waves)
        assert sum(w["jobs"] for w in waves) == focus["rollouts"] - 4 * row["tasks"]
        assert all(focus.get(k) is not None for k in WAVE_FIGURES)
        q = max(1, len(waves) // 4)
        assert focus["jobs_per_wave_last_quarter"] == sum(w["jobs"] for w in waves[-q:]) / q
    ratios = figures["ratios"]
    for k in (
        "focus_vs_baseline_cpu_per_transition",
        "focus_vs_baseline_cpu_per_transition_without_gc",
        "focus_vs_baseline_transitions_per_s",
        "focus_vs_tuned_transitions_per_s",
        "focus_vs_tuned_cpu_per_transition",
    ):
        assert set(ratios[k]) == set(keys) and all(v > 0 for v in ratios[k].values())
    assert ratios["smallest_size"] == "300" and ratios["largest_size"] == "1k"
    # both series start from the one 300-transition row (6 tasks = 20 per 1k at that size)
    growth = ratios["focus_cpu_per_transition_vs_smallest"]
    assert set(growth) == {"1k_6t", "1k_20t"}
    row = {r["key"]: r for r in figures["rows"]}
    assert growth["1k_20t"] == pytest.approx(
        row["1k_20t"]["focus"]["cpu_ms_per_transition"] / row["300_6t"]["focus"]["cpu_ms_per_transition"]
    )
    assert set(ratios["plan_cpu_per_wave_last_vs_first_quarter_at_largest"]) == {"1k_6t", "1k_20t"}
    assert set(ratios["focus_vs_baseline_rss_growth_per_transition_at_largest"]) == {"1k_6t", "1k_20t"}
    assert set(ratios["focus_idle_share"]) == set(keys)
    for goal in scale.GOALS:
        g = figures["goals"][goal]
        assert g["goal"] == scale.GOALS[goal] and g["worst"] is not None and g["met"] == (g["worst"] <= g["goal"])
    for goal, bound in scale.THROUGHPUT_GOALS.items():  # at least the bound, the lowest row is the worst
        g = figures["goals"][goal]
        assert g["goal"] == bound and g["worst"] == min(ratios[goal].values()) and g["met"] == (g["worst"] >= bound)


def test_the_arms_in_process_collect_what_the_server_would_answer():
    """benchmarks/scale_inproc.py: the arms against the simulated server's answers in
    process (no HTTP) collect their budget, the same collection each run, and every
    bucket is a part of the CPU."""
    import asyncio

    from benchmarks import scale_inproc
    from focus.policy import SamplingParams
    from focus.testing.simserver import sample

    policy = scale_inproc.SimPolicy()
    params = SamplingParams(max_tokens=8, stop_token_ids=(10,), seed=7)
    got = asyncio.run(policy.sample([1, 2, 3], params))
    ids, lps, finish = sample([1, 2, 3], 3, 8, (10,), 7)
    assert (list(got.token_ids), list(got.logprobs), got.finish_reason) == (ids, lps, finish)
    for arm in ("focus", "tuned"):
        a, b = (scale_inproc.run_arm(arm, 300, 6, concurrency=32) for _ in range(2))
        assert (a["transitions"], a["rollouts"]) == (b["transitions"], b["rollouts"])
        assert 0.85 * 300 <= a["transitions"] <= 1.3 * 300
        parts = a["rollout_us"] + a["search_us"] + a["prepare_us"]
        assert parts == pytest.approx(a["cpu_us"]) and a["rollout_us"] > 0
        assert (a["search_us"] > 0) == (arm == "focus")


def test_depth_share_reaches_the_focus_arms_search_and_is_recorded():
    from benchmarks.scale import child_config, parse_args, run_config
    from benchmarks.scale_arms import arm_search
    from focus.priority import Selective

    tasks = reach_target_tasks(4, seed=0)
    default = parse_args([])
    cfg = child_config(default, "focus", 2000, 4)
    assert cfg["depth_share"] is None and run_config(default)["depth_share"] is None
    assert arm_search(cfg, tasks, 20).depth_share == Selective().depth_share  # the library's default
    zero = parse_args(["--depth-share", "0"])
    assert run_config(zero)["depth_share"] == 0.0
    assert arm_search(child_config(zero, "focus", 2000, 4), tasks, 20).depth_share == 0.0
    with pytest.raises(SystemExit):
        parse_args(["--depth-share", "-1"])
