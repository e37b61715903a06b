"""The simulated model server of benchmarks/engine.py, and the benchmark at tiny size."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.format import ByteCodec
from focus.policy import PolicyError, SamplingParams
from focus.testing.simserver import PrefixCache, SimConfig, SimServerProcess, sample

PARAMS = SamplingParams(max_tokens=8, stop_token_ids=(ByteCodec.EOT,))


def test_prefix_cache_matches_longest_seen_prefix_and_flushes_when_full():
    cache = PrefixCache(capacity=10)
    assert cache.match([1, 2, 3]) == 0
    cache.insert([1, 2, 3, 4])
    assert cache.match([1, 2, 3, 4, 5]) == 4 and cache.match([1, 2, 9]) == 2 and cache.match([2]) == 0
    cache.insert([1, 2, 7, 8])
    assert cache.size == 6 and cache.match([1, 2, 7]) == 3
    cache.insert(list(range(100, 110)))  # passes capacity: everything goes
    assert cache.flushes == 1 and cache.size == 0 and cache.match([1, 2]) == 0


def test_sampling_is_deterministic_in_the_seed_and_respects_limits():
    ids, lps, finish = sample([1, 2], n=4, max_tokens=8, stop_ids=[ByteCodec.EOT], seed=5)
    assert (ids, lps, finish) == sample([9], n=4, max_tokens=8, stop_ids=[ByteCodec.EOT], seed=5)
    assert len(ids) == 4 and ids[-1] == ByteCodec.EOT and finish == "stop"
    assert all(ord("1") <= t <= ord("9") for t in ids[:-1]) and all(lp < 0 for lp in lps)
    short = sample([1], n=4, max_tokens=2, stop_ids=[ByteCodec.EOT], seed=5)
    assert short[0] == ids[:2] and short[2] == "length"


@pytest.fixture(scope="module")
def sim():
    with SimServerProcess(SimConfig(slots=2, latency_s=0.2, completion_tokens=3)) as server:
        yield server


@pytest.mark.integration  # starts a server
def test_policy_talks_to_the_server_and_resent_prefixes_hit_the_cache(sim):
    async def go():
        policy = OpenAICompatPolicy(sim.url, vocab_size=ByteCodec.vocab_size)
        try:
            first = await policy.sample([1, 2, 3, 4], PARAMS.with_seed(1))
            prompt = [1, 2, 3, 4, *first.token_ids, 5, 6]
            second = await policy.sample(prompt, PARAMS.with_seed(2))
            again = await policy.sample(prompt, PARAMS.with_seed(3))
            return first, second, again
        finally:
            await policy.aclose()

    first, second, again = asyncio.run(go())
    assert len(first.token_ids) == 3 and first.token_ids[-1] == ByteCodec.EOT and first.finish_reason == "stop"
    assert first.cached_prompt_tokens == 0
    assert second.cached_prompt_tokens == 4 + 3  # prompt + completion of the first call, not the new ids
    assert again.cached_prompt_tokens == 4 + 3 + 2  # the exact prefix was seen: all of it is cached
    rows = {r[3]: r for r in sim.requests()}
    assert rows[3][4:6] == [9, 9] and rows[1][4:6] == [4, 0]


def test_slots_bound_the_requests_in_service_and_the_rest_queue(sim):
    sim.reset()

    async def go():
        policy = OpenAICompatPolicy(sim.url, config=HttpConfig(max_concurrency=16))
        try:
            t0 = time.perf_counter()
            await asyncio.gather(*(policy.sample([7, i], PARAMS.with_seed(i)) for i in range(6)))
            return time.perf_counter() - t0
        finally:
            await policy.aclose()

    wall = asyncio.run(go())
    stats = sim.stats()
    assert stats["requests"] == 6 and stats["max_in_flight"] == 2 and stats["max_waiting"] >= 3
    assert wall >= 3 * 0.2 - 0.01  # 6 calls through 2 slots: three rounds of the latency
    # each call held a slot for at least the latency; two slots cannot be busy for longer than the wall time
    assert 6 * 0.2 - 0.01 <= stats["busy_slot_s"] <= 2 * wall


def test_bad_requests_get_a_clear_error(sim):
    async def go(prompt):
        policy = OpenAICompatPolicy(sim.url, config=HttpConfig(max_retries=0))
        try:
            return await policy.sample(prompt, PARAMS)
        finally:
            await policy.aclose()

    with pytest.raises(PolicyError, match="rejected with status 400.*token id 999 is outside the vocabulary"):
        asyncio.run(go([1, 999]))


@pytest.mark.integration  # starts a server
def test_without_a_cache_nothing_is_served_from_it():
    with SimServerProcess(SimConfig(slots=4, latency_s=0.0, cache_capacity_tokens=0)) as server:

        async def go():
            policy = OpenAICompatPolicy(server.url)
            try:
                return [await policy.sample([1, 2, 3], PARAMS.with_seed(i)) for i in range(2)]
            finally:
                await policy.aclose()

        assert [c.cached_prompt_tokens for c in asyncio.run(go())] == [0, 0]
        scratch = server._tmp
        assert scratch is not None and scratch.is_dir()
    # stopping removes the server's scratch folder (port file, log): no folder left per start
    assert server._tmp is None and not scratch.exists()


@pytest.mark.timeout(120)
@pytest.mark.integration
def test_engine_benchmark_runs_at_tiny_size_and_reports_every_figure(tmp_path):
    from benchmarks import engine

    out = tmp_path / "engine.json"
    figures = engine.main(["--small", "--json", str(out)])
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(json.dumps(figures))
    for key in ("slot_utilisation", "engine_cpu_ms_per_transition", "prefix_cache_hit_ratio", "scaling_1_to_2_workers"):
        assert key in figures and figures[key] == figures[key]  # present and not NaN
    assert 0 < figures["slot_utilisation"] <= 1.0 and figures["engine_cpu_ms_per_transition"] > 0
    assert figures["transitions"] > 0 and figures["failed_rollouts"] == 0
    # the headline is the pipeline's mode (waves planned ahead); every mode is reported
    assert figures["headline_mode"] == "pipeline" and figures["waves_in_flight"] >= 2
    assert {"pipeline_mode", "wave_mode", "streaming_mode"} <= set(figures)
    assert figures["wave_mode"]["waves_in_flight"] == 1
    # continuations resend their checkpoint's exact prefix, which the earlier call left in the cache
    assert figures["continuation_first_calls"] > 0 and figures["continuation_calls_not_found"] == 0
    assert figures["prefix_cache_hit_ratio"] == 1.0
    assert figures["dask_1_workers"]["transitions"] > 0 and figures["dask_2_workers"]["transitions"] > 0
    assert figures["scale_env_cpu_ms"] > 0 and figures["dask_2_workers_toy_env"]["transitions"] > 0


def test_execution_starts_jobs_with_most_steps_left_first_and_keeps_job_order():
    """Engine tweaks measured by the benchmarks: longest-first start order, one worker
    per slot, GC frozen (and young collections spaced out) only while the wave runs, unless ``freeze_gc`` is off. A recording agent stands in for the real one (unit test)."""
    import gc
    from types import SimpleNamespace

    from focus.execution import GC_THRESHOLD_FROZEN, Execution, frozen_by_others

    started: list[int] = []
    frozen_during: list[bool] = []
    thresholds_during: list[int] = []
    tasks_alive: list[int] = []
    before = gc.get_threshold()

    class Recording:
        async def rollout(self, start, seed):
            started.append(start.steps)
            frozen_during.append(frozen_by_others())
            thresholds_during.append(gc.get_threshold()[0])
            tasks_alive.append(len(asyncio.all_tasks()))
            await asyncio.sleep(0.001 * start.steps)
            return SimpleNamespace(leaf=SimpleNamespace(kind="done"), seed=seed)

    steps = [3, 0, 5, 1, 0, 2]
    jobs = [
        SimpleNamespace(start=SimpleNamespace(steps=s), seed=i, node_id=i, tree_index=0) for i, s in enumerate(steps)
    ]
    out = asyncio.run(Execution(max_concurrency=2).run(Recording(), jobs))  # type: ignore[arg-type]  # the default: on
    assert [r.seed for r in out] == list(range(len(steps)))
    assert started == sorted(steps)
    assert all(frozen_during) and not frozen_by_others()
    assert min(thresholds_during) >= GC_THRESHOLD_FROZEN and gc.get_threshold() == before
    # one worker per slot, not one task per job: the main task plus two workers
    assert max(tasks_alive) == 3
    started.clear()
    asyncio.run(Execution(max_concurrency=2, freeze_gc=False).run(Recording(), jobs))  # type: ignore[arg-type]
    assert frozen_during[-1] == 0 and thresholds_during[-1] == before[0]
