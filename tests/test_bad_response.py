"""Answers are checked: one that breaks the policy contract never reaches a batch.

An answer longer than the request's ``max_tokens``, log-probs that do not line up with
the tokens, or a token id outside the vocabulary: the rollout fails as a ``bad
response`` (counted by that kind) and none of its tokens is stored. It is run again with
its seed (``BAD_RESPONSE_RERUNS``); if every run gets a bad answer, it is never stored:
the collection stops at its wave with one line saying how many, by cause, and that a
rerun replays them; the rerun runs only those rollouts again, so against a fixed server
the batch is a clean run's. Bad responses also count against a wave's outage share like
the model service's failures, so a server that keeps answering that way fails the wave
at once. Real parts: the tiny model server behind the fault proxy, which lengthens
answers (``overlong``), replaces ids (``foreign_id``) or drops a log-prob
(``short_logprobs``) in otherwise good answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from fixtures.journal import AfterStep, run_collect

from flows.errors import one_line
from focus.agent import Agent, Piece, Rollout, failure_prefix
from focus.execution import BAD_RESPONSE_RERUNS, BadResponses, ModelServiceOutage, check_outage, is_service_failure
from focus.format import ByteCodec, PolicyFormat, XmlToolCallParser
from focus.journal import EVIDENCE_SCORES
from focus.policy import BadResponse, Completion, PolicyError, SamplingParams, ServiceUnavailable
from focus.testing import ScriptedPolicy, run
from focus.testing.faults import FaultProxy
from focus.toy import ReachTarget, reach_target_tasks
from focus.usage import Usage
from storage import BatchStore, CheckpointStore
from tasks.config import load_config
from tasks.journal import CheckpointJournal

pytestmark = pytest.mark.timeout(240)

MAX_TOKENS = 8


# ---- the checks (pure) ----


def test_an_answer_longer_than_max_tokens_or_with_foreign_ids_is_a_bad_response():
    policy = ScriptedPolicy(["x"])
    params = SamplingParams(max_tokens=4)
    policy.check_completion(Completion((65,) * 4, (-1.0,) * 4, "length"), params)  # exactly the limit: fine
    with pytest.raises(BadResponse, match=r"6 tokens sampled where max_tokens = 4 were asked"):
        policy.check_completion(Completion((65,) * 6, (-1.0,) * 6, "length"), params)
    with pytest.raises(BadResponse, match=r"sampled token id 70000 at position 1 is outside the vocabulary"):
        policy.check_completion(Completion((65, 70000), (-1.0, -1.0)), params)
    with pytest.raises(BadResponse, match="2 tokens but 1 log-probs"):
        Completion((65, 66), (-1.0,))
    assert issubclass(BadResponse, PolicyError)  # callers that catch PolicyError still do


def test_a_bad_response_is_its_own_failure_kind_and_counts_toward_the_outage_share():
    bad = Rollout("t", (Piece((), "failed", 0, (1,), cause="bad response: 12 tokens sampled where ..."),))
    done = Rollout("t", (Piece((), "terminal", 1, ()),))
    assert failure_prefix(BadResponse("POST x failed after 3 attempt(s); last: malformed")) == "bad response"
    assert failure_prefix(ServiceUnavailable("down")) == "model service"
    assert failure_prefix(PolicyError("rejected with status 400")) == "model"
    assert Usage.of_rollout(bad).failures == (("bad response", 1),)
    assert is_service_failure(bad)
    with pytest.raises(ModelServiceOutage, match="2 of 10 rollouts"):
        check_outage([bad] * 2 + [done] * 8, 0.1)


class _Overlong(ScriptedPolicy):
    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        await super().sample(prompt_ids, params)
        n = params.max_tokens + 13
        return Completion((65,) * n, (-1.0,) * n, "length")


def test_the_agent_fails_the_rollout_and_keeps_no_token_of_the_answer():
    codec = ByteCodec()
    sampling = SamplingParams(max_tokens=MAX_TOKENS)
    agent = Agent(_Overlong(["1"], codec), ReachTarget(), PolicyFormat(codec, XmlToolCallParser()), sampling=sampling)
    ro = run(agent.rollout(run(agent.start(reach_target_tasks(1, seed=0)[0])), seed=0))
    assert ro.leaf.kind == "failed" and not ro.turns
    assert (
        ro.leaf.cause
        == "bad response: 21 tokens sampled where max_tokens = 8 were asked (does the server honour max_tokens?)"
    )


# ---- through the pipeline, against the real server ----

#: Short retries: a malformed answer is retried, then the rollout fails.
HTTP = {"max_retries": 2, "backoff_s": 0.01, "backoff_max_s": 0.05, "timeout_s": 20.0, "outage_wait_s": 0}


def config(root: str, cid: str, url: str, **more: Any):  # type: ignore[no-untyped-def]
    return load_config(
        overrides={
            "collection_id": cid,
            "seed": 8,
            "model.kind": "openai",
            "model.url": url,
            "model.http": HTTP,
            "env.n_tasks": 4,
            "agent.sampling.max_tokens": MAX_TOKENS,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 3},
                {"name": "continue", "transitions": 18, "wave_size": 6, "max_depth": 6},
            ],
            "execution.kind": "local",
            "execution.max_concurrency": 4,
            "storage.root": root,
            "progress": False,
            **more,
        },
        environ={},
    )


def longest_completion(batch_url: str) -> int:
    actor = pq.read_table(f"{batch_url.removeprefix('file://')}/actor")
    return int(pc.max(pc.list_value_length(actor.column("completion_ids"))).as_py())


#: Runs of a rollout before a bad response counts: the first and its reruns.
RUNS = BAD_RESPONSE_RERUNS + 1


@pytest.fixture(scope="module")
def clean(local_model_server, tmp_path_factory):
    """The fault-free collection's batch, straight to the server."""
    root = str(tmp_path_factory.mktemp("clean"))
    out = run_collect(config(root, "clean", local_model_server.url))
    return BatchStore(root).read(out["batch_url"])


def rows(batch):  # type: ignore[no-untyped-def]
    return [(a.tree_id, a.edge_id, a.completion_ids, a.logprobs, a.advantage) for a in batch.actor]


def test_a_bad_answer_on_every_run_stops_the_collection_and_a_rerun_replays_it(local_model_server, clean, tmp_path):
    """A rollout whose every run gets a bad answer is never stored: the collection stops
    at its wave (evidence in the first run, a continuation wave in the second) with one
    line counting them by cause and saying how to replay them; the wave's other
    rollouts are recorded as unfinished. Each rerun runs only those rollouts again with
    the same jobs; once the server answers properly the batch is a clean run's."""
    root, cid = str(tmp_path), "replay"
    store = CheckpointStore(root)
    # one rollout at a time: the queued faults hit the first rollouts' calls, each run of them
    one = {"execution.max_concurrency": 1, "execution.max_outage_share": 0.5}
    with FaultProxy(local_model_server.url) as proxy:
        cfg = config(root, cid, proxy.url, **one)
        proxy.queue("overlong", RUNS)  # the first evidence rollout, on each of its runs
        proxy.queue("foreign_id", RUNS)  # the second
        with pytest.raises(BadResponses) as first:
            run_collect(cfg)
        assert proxy.pending() == 0
        line = one_line(first.value)
        assert line.startswith("bad responses: 2 of 12 rollouts of phase evidence wave 0 got an answer that ")
        assert "1x 21 tokens sampled where max_tokens = 8 were asked" in line
        assert "1x sampled token id 70000 at position 0 is outside the vocabulary" in line
        assert "rerun with the same collection id to run them again (by cause: " in line and "\n" not in line
        assert sorted(store.list(cid)) == [("0.evidence.unfinished", 0), ("config", 0), ("critic", 0)]

        # the rerun runs the two again (fine now), goes on, and meets a bad answer in the
        # first continuation wave: every attempt of its first rollout's first call, each
        # run (that request's alone: a probe beside it, to another prompt, reads fine;
        # every request answered so would be a server that cannot be read)
        def break_the_server() -> None:
            proxy.queue("short_logprobs", (HTTP["max_retries"] + 1) * RUNS, one_request=True)

        second = AfterStep(cfg, EVIDENCE_SCORES, break_the_server)
        with pytest.raises(
            BadResponses, match=r"^bad responses: 1 of \d+ rollouts of phase continue wave 0 .*log-probs"
        ):
            run_collect(cfg, second)
        assert proxy.pending() == 0
        assert ("evidence", 0) in store.list(cid) and ("1.continue.unfinished", 0) in store.list(cid)
        assert ("1.continue", 0) not in store.list(cid)
        # the usage records count the bad responses by cause: the evidence's (replayed) and the wave's
        replayed = [r for r in second.records if r.kind == "unfinished"]
        assert [(r.reused, r.failed_rollouts) for r in replayed] == [(True, 2), (False, 1)]
        assert second.tally.usage.failed("bad response") == 3

        third = CheckpointJournal(cfg)
        out = run_collect(cfg, third)
        assert proxy.pending() == 0
    assert [(r.kind, r.reused) for r in third.records if r.kind in ("unfinished", "wave")][:2] == [
        ("unfinished", True),
        ("wave", False),
    ]
    got, want = BatchStore(root).read(out["batch_url"]), clean
    assert got.stats["failed_rollouts"] == 0 and not got.stats["failed_bad_response"]
    assert 0 < longest_completion(out["batch_url"]) <= MAX_TOKENS
    assert rows(got) == rows(want)


def test_a_server_that_keeps_answering_too_long_fails_the_wave_and_a_rerun_replays_it(
    local_model_server, clean, tmp_path
):
    root = str(tmp_path)
    with FaultProxy(local_model_server.url) as proxy:
        cfg = config(root, "overlong", proxy.url)
        proxy.rate, proxy.kinds = 1.0, ("overlong",)  # a server that ignores max_tokens
        with pytest.raises(ModelServiceOutage, match=r"last cause: bad response: 21 tokens sampled"):
            run_collect(cfg)
        assert CheckpointStore(root).list("overlong") == [("config", 0), ("critic", 0)]  # nothing of it stored
        proxy.rate = 0.0  # the server is fixed: the rerun computes the same rollouts again
        again = run_collect(cfg)
    got = BatchStore(root).read(again["batch_url"])
    assert got.stats["failed_rollouts"] == 0 and longest_completion(again["batch_url"]) <= MAX_TOKENS
    assert rows(got) == rows(clean)


def test_a_passing_bad_answer_is_run_again_and_the_batch_is_a_clean_runs(local_model_server, clean, tmp_path):
    """Below the outage share, a bad answer used to stay in the batch as a failed leaf that
    no rerun or resume would replace. Now the rollout is run again with its seed: a
    server that misbehaves on a few answers (the first run of the first rollout gets an
    over-long answer, its rerun one with a foreign id: every run but the last) costs
    reruns of that rollout, and the batch is the one a clean run writes, with no
    failure in it."""
    root = str(tmp_path)
    assert BAD_RESPONSE_RERUNS == 2  # the two faults below are its budget
    with FaultProxy(local_model_server.url) as proxy:
        proxy.queue("overlong", 1)
        proxy.queue("foreign_id", 1)
        out = run_collect(config(root, "passing", proxy.url, **{"execution.max_concurrency": 1}))
        assert proxy.pending() == 0
    got = BatchStore(root).read(out["batch_url"])
    assert got.stats["failed_rollouts"] == 0 and not got.stats.get("failed_bad_response")
    assert rows(got) == rows(clean)


def test_through_prefect_the_run_fails_in_one_line_and_a_rerun_replays_it(local_model_server, prefect_api, tmp_path):
    """The ``collect`` flow (an evidence phase only, to keep it short): the run fails with
    the line saying how to replay (the flow run's state message), and the rerun replays
    the evidence's bad responses only."""
    from prefect.client.orchestration import get_client

    from flows.collect import collect

    root = str(tmp_path)
    small = {
        "env.n_tasks": 2,
        "search.phases": [{"name": "evidence", "rollouts_per_task": 3}],
        "execution.max_concurrency": 1,
        "execution.max_outage_share": 0.5,
    }
    with FaultProxy(local_model_server.url) as proxy:
        cfg = config(root, "flow-replay", proxy.url, **small)
        proxy.queue("overlong", RUNS)
        with pytest.raises(BadResponses, match=r"^bad responses: 1 of 6 rollouts of phase evidence wave 0 .*rerun"):
            asyncio.run(collect(cfg))
        assert sorted(CheckpointStore(root).list("flow-replay"))[0] == ("0.evidence.unfinished", 0)

        async def last_run():  # type: ignore[no-untyped-def]
            async with get_client() as client:
                (run,) = await client.read_flow_runs(limit=1, sort="EXPECTED_START_TIME_DESC")
                return run

        run = asyncio.run(last_run())
        assert run.state.is_failed() and (run.state.message or "").startswith("bad responses: 1 of 6 rollouts")
        out = asyncio.run(collect(cfg))
        assert proxy.pending() == 0
    got = BatchStore(root).read(out["batch_url"])
    assert out["stats"]["steps_reused"] == 2  # the config check and the unfinished evidence
    assert got.stats["failed_rollouts"] == 0 and got.stats["rollouts"] == 6
