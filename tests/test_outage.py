"""A model service that is out fails the wave, not the data.

Rollouts whose model calls get no usable answer within the client's retries end with a
``model service:`` cause; once more than ``Execution.max_outage_share`` of a wave's
rollouts did, the wave raises ``ModelServiceOutage`` at once (its other jobs cancelled),
nothing of it is stored, finished waves are kept, and a rerun after the service returns
computes the failed wave again and ends with the batch of an uninterrupted run. Real
parts: the tiny model server behind a fault proxy that answers 503 to every request.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from fixtures.journal import AfterStep, run_collect

from focus.agent import Agent, Piece, Rollout, is_outage
from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.execution import Execution, ModelServiceOutage, check_outage
from focus.format import ByteCodec
from focus.journal import end_step
from focus.policy import PolicyError, SamplingParams, ServiceUnavailable
from focus.priority import Phase, Selective
from focus.testing.faults import FaultProxy
from focus.toy import ReachTarget, reach_target_tasks, toy_format
from focus.usage import failure_kind
from storage import BatchStore, CheckpointStore
from tasks.config import load_config
from tasks.journal import CheckpointJournal

pytestmark = pytest.mark.timeout(180)

#: 3 attempts, ~0.1 s of backoff, and a service that stopped answering is waited for
#: 1 s: the client gives up well within a few seconds.
RETRY = {
    "max_retries": 2,
    "backoff_s": 0.02,
    "backoff_max_s": 0.05,
    "timeout_s": 5.0,
    "connect_timeout_s": 2.0,
    "outage_wait_s": 1.0,
}
ATTEMPTS = RETRY["max_retries"] + 1


def proxied_policy(url: str) -> OpenAICompatPolicy:
    """The factory the pipeline config names: the tiny model through the fault proxy."""
    return OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size, config=HttpConfig(**RETRY))


def failed(cause: str) -> Rollout:
    return Rollout("t", (Piece((), "failed", 0, (1,), cause=cause),))


def done() -> Rollout:
    return Rollout("t", (Piece((), "terminal", 1, ()),))


# ---- classification (pure) ----


def test_causes_are_classified_by_where_they_came_from():
    assert is_outage(PolicyError("POST http://x/v1/completions failed after 5 attempt(s); last: status 503: down"))
    assert is_outage(ServiceUnavailable("no answer"))
    assert not is_outage(PolicyError("POST http://x was rejected with status 400: bad token"))
    assert not is_outage(PolicyError("sampled token id 70000 at position 0 is outside the vocabulary"))
    kinds = {c: failure_kind(c) for c in ("model service: x", "model: y", "env: step timed out", "error: Boom: z")}
    assert kinds == {
        "model service: x": "model service",
        "model: y": "model",
        "env: step timed out": "env",
        "error: Boom: z": "error",
    }


def test_only_model_service_failures_beyond_the_share_fail_a_wave():
    service, env, model = failed("model service: down"), failed("env: Boom"), failed("model: rejected")
    check_outage([env] * 9 + [model] * 9 + [done()] * 2, 0.1)  # env and bad answers never do
    check_outage([service] + [done()] * 9, 0.1)  # 10% is not more than 10%
    with pytest.raises(ModelServiceOutage, match=r"2 of 10 rollouts .* model service: down") as err:
        check_outage([service] * 2 + [done()] * 8, 0.1)
    assert (err.value.failed, err.value.jobs) == (2, 10)
    check_outage([service] * 10, 1.0)  # 1.0 keeps every failed rollout, as before


# ---- the library: a dead service fails the wave within the retry window ----


def collector(url: str, *, concurrency: int, phases) -> Collector:  # type: ignore[no-untyped-def]
    agent = Agent(proxied_policy(url), ReachTarget(), toy_format(), max_steps=6, sampling=SamplingParams(max_tokens=8))
    return Collector(
        agent,
        search=Selective(phases=phases),
        critic=ConstantCritic(0.5),
        execution=Execution(max_concurrency=concurrency),
        collection_id="outage",
        seed=3,
    )


def test_a_dead_service_fails_the_wave_at_once_instead_of_retrying_every_job(local_model_server):
    phases = [Phase("evidence", rollouts_per_task=2)]
    with FaultProxy(local_model_server.url, rate=1.0, kinds=("503",)) as proxy:
        col = collector(proxy.url, concurrency=2, phases=phases)

        async def go():  # type: ignore[no-untyped-def]
            try:
                return await col.search(reach_target_tasks(10, seed=5))
            finally:
                await col.agent.policy.aclose()

        t0 = time.monotonic()
        with pytest.raises(
            ModelServiceOutage, match=r"model service: POST .*failed after \d attempt\(s\).*outage_wait_s = 1 s.*503"
        ) as err:
            asyncio.run(go())
        elapsed = time.monotonic() - t0
    # 20 jobs, 2 at a time: the wave stops once 3 rollouts (> 10% of 20) have failed,
    # instead of sending every job's every attempt (20 x 3 requests); while the calls
    # wait for the service (1 s), one of them tries again every backoff_max_s. Read from
    # the requests, not wall time (it once asserted under 30 s; a loaded machine is slow)
    probes = RETRY["outage_wait_s"] / RETRY["backoff_max_s"] + 2
    assert err.value.failed == 3 and err.value.jobs == 20
    assert proxy.requests <= (err.value.failed + 2) * ATTEMPTS + probes < 20 * ATTEMPTS, (proxy.requests, elapsed)


# ---- the pipeline: finished waves kept, the failed wave recomputed on rerun ----


def config(root: str, cid: str, url: str):  # type: ignore[no-untyped-def]
    return load_config(
        overrides={
            "collection_id": cid,
            "seed": 4,
            "model.kind": "factory",
            "model.factory": "test_outage:proxied_policy",
            "model.options": {"url": url},
            "env.n_tasks": 3,
            "agent.sampling.max_tokens": 8,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 12, "wave_size": 3, "max_depth": 6},
                {"name": "more", "transitions": 6, "wave_size": 3, "max_depth": 6},
            ],
            "execution.kind": "local",
            "execution.max_concurrency": 4,
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


def key(batch):  # type: ignore[no-untyped-def]
    actor = [
        (r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, round(r.advantage, 9)) for r in batch.actor
    ]
    return actor, [(r.tree_id, r.node_id, r.context_ids, round(r.target, 9), r.weight) for r in batch.critic]


def test_an_outage_mid_collection_keeps_finished_waves_and_a_rerun_recomputes_the_failed_one(
    local_model_server, tmp_path
):
    root = str(tmp_path / "store")
    with FaultProxy(local_model_server.url) as proxy:
        clean = run_collect(config(root, "clean", proxy.url))
        cfg = config(root, "outage", proxy.url)

        def die() -> None:  # the service dies for good once the first continuation phase is saved
            proxy.rate, proxy.kinds = 1.0, ("503",)

        steps = AfterStep(cfg, end_step(1), die)
        with pytest.raises(ModelServiceOutage, match="model service outage"):
            run_collect(cfg, steps)
        before = steps.store.list("outage")
        assert ("1.continue", 0) in before and ("1.continue.score", 0) in before  # finished waves kept
        assert not [k for k in before if k[0].startswith("2.")]  # nothing of the failed wave is stored

        proxy.rate = 0.0  # the service is back: a rerun (a new process would do the same)
        again = CheckpointJournal(cfg)
        result = run_collect(cfg, again)
    saved = again.store.list("outage")
    assert ("2.more", 0) in saved and saved.index(("2.more", 0)) > saved.index(("1.continue.end", 0))
    store = BatchStore(root)
    got, want = store.read(result["batch_url"]), store.read(clean["batch_url"])
    assert got.stats["failed_rollouts"] == 0 and len(got.actor) > 0
    assert key(got) == key(want)
    # the embedded server's numerics do not depend on its cache or batch: bit for bit
    assert [(a.logprobs, a.advantage) for a in got.actor] == [(b.logprobs, b.advantage) for b in want.actor]
    assert [(a.target, a.weight) for a in got.critic] == [(b.target, b.weight) for b in want.critic]


def test_the_flow_fails_naming_the_outage_and_a_rerun_completes(local_model_server, prefect_api, tmp_path):
    """Through Prefect: the service is down from the start, so the evidence step fails
    (flow run Failed, the outage named); once it is back the same collection completes."""
    from prefect.client.orchestration import get_client

    from flows.collect import collect

    root = str(tmp_path / "store")
    with FaultProxy(local_model_server.url, rate=1.0, kinds=("503",)) as proxy:
        cfg = config(root, "flow-outage", proxy.url)
        with pytest.raises(ModelServiceOutage, match="model service outage"):
            asyncio.run(collect(cfg))
        assert CheckpointStore(root).list("flow-outage") == [("config", 0), ("critic", 0)]

        async def last_run():  # type: ignore[no-untyped-def]
            async with get_client() as client:
                (run,) = await client.read_flow_runs(limit=1, sort="EXPECTED_START_TIME_DESC")
                return run

        run = asyncio.run(last_run())
        assert run.state.is_failed() and "model service outage" in (run.state.message or "")
        proxy.rate = 0.0
        out = asyncio.run(collect(cfg))
    batch = BatchStore(root).read(out["batch_url"])
    assert batch.stats["failed_rollouts"] == 0 and out["stats"]["steps_reused"] == 1  # the config check
