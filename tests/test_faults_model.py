"""Model-service faults on a real socket: the tiny model server behind a fault proxy.

Every kind the proxy injects (429, 5xx, timeouts, closed and reset connections,
non-JSON bodies, fewer log-probs than tokens, NaN log-probs) is retried with backoff;
when retries succeed the collection's batch is exactly the fault-free one (no row lost,
none duplicated). When a fault persists past the retries, that rollout - only that one -
ends in a failed leaf whose cause names the fault, the learning signals leave it out
without treating the partial group as complete, and the batch statistics count it; an
answer that persists in breaking the contract (a bad response) stops the collection at
its wave instead, so that no rerun keeps the failure (tests/test_bad_response.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

import pytest

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy, SGLangPolicy
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import PolicyError, SamplingParams
from focus.priority import Phase, Selective
from focus.testing.faults import KINDS, FaultProxy
from focus.toy import ReachTarget, reach_target_tasks, toy_format

pytestmark = pytest.mark.timeout(120)

RETRIES = 4
#: A service that answers nobody fails the calls within their retries here (not waited
#: for: tests/test_outage_wait.py and tests/test_restart.py test that).
HTTP = HttpConfig(
    backoff_s=0.01, backoff_max_s=0.05, max_retries=RETRIES, timeout_s=2.5, connect_timeout_s=2, outage_wait_s=0
)
PHASES = [Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=30, wave_size=6, max_depth=6)]

#: The kinds of cause the HTTP client counts retries and failed calls by.
CAUSE_KIND = ("server error", "connection", "malformed response", "timeout")
#: The cause word the HTTP client records for each injected kind.
CAUSE = {
    "429": "status 429",
    "500": "status 500",
    "502": "status 502",
    "503": "status 503",
    "timeout": "timeout",
    "close": "connection",
    "reset": "connection",
    "malformed": "not JSON",
    "short_logprobs": "log-probs",
    "nan_logprobs": "not a finite number",
}


def collector(
    url: str, *, phases=PHASES, concurrency: int = 8, backend=OpenAICompatPolicy, http=HTTP, outage_share: float = 0.1
) -> Collector:
    policy = backend(url, vocab_size=ByteCodec.vocab_size, config=http)
    agent = Agent(policy, ReachTarget(), toy_format(), max_steps=6, sampling=SamplingParams(max_tokens=8))
    return Collector(
        agent,
        search=Selective(phases=phases),
        critic=ConstantCritic(0.5),
        estimator=DirectBranchTd(),
        execution=Execution(max_concurrency=concurrency, max_outage_share=outage_share),
        collection_id="faults",
        seed=3,
    )


def collect(col: Collector, n_tasks: int = 3):
    async def go():
        try:
            return await col.search(reach_target_tasks(n_tasks, seed=5))
        finally:
            await col.agent.policy.aclose()

    state = asyncio.run(go())
    return state, col.prepare(state)


def key(batch):
    """Everything but log-prob rounding: ids, tokens, advantages, targets."""
    actor = [
        (r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, r.loss_mask, round(r.advantage, 9))
        for r in batch.actor
    ]
    critic = [(r.tree_id, r.node_id, round(r.target, 9), r.weight) for r in batch.critic]
    return actor, critic


def same_logprobs(a, b) -> bool:
    return all(x.logprobs == pytest.approx(y.logprobs, abs=1e-5) for x, y in zip(a.actor, b.actor, strict=True))


@pytest.fixture(scope="module")
def clean(local_model_server):
    """The fault-free collection, straight to the server."""
    return collect(collector(local_model_server.url))


@pytest.mark.parametrize("backend", [OpenAICompatPolicy, SGLangPolicy])
def test_every_fault_kind_is_retried_and_the_batch_is_unchanged(local_model_server, clean, backend):
    _, want = clean
    # a timeout fault holds its answer 1.5 s, past the calls' 1 s (each one injected cost
    # the 2.5 s of the module's timeout_s); a slow answer on a loaded machine is retried
    with FaultProxy(local_model_server.url, rate=0.15, seed=1, hang_s=1.5) as proxy:
        for kind in KINDS:  # each kind at least once, on the first requests
            proxy.queue(kind)
        # the queued faults go to the first requests, and with the evidence's siblings in
        # one request per task a request and its retries may draw several of them in a
        # row (which one depends on timing: under load one drew 5 and ended its call, a
        # rollout of 6 in the wave failed, past max_outage_share): retries enough for all
        http = HTTP.model_copy(update={"max_retries": len(KINDS) + 1, "timeout_s": 1.0})
        col = collector(proxy.url, backend=backend, http=http)
        state, got = collect(col)
    assert set(proxy.injected) == set(KINDS)
    # every injected fault was retried (a slow answer on a loaded machine may add a
    # retry), or ended a call whose rollouts the execution ran again; none escaped into
    # the batch
    stats = col.agent.policy.http.stats()
    seen = Counter(stats["retries"]) + Counter(stats["failed_calls"])
    assert set(stats["failed_calls"]) <= set(CAUSE_KIND) and sum(stats["failed_calls"].values()) <= 1
    assert sum(seen.values()) >= sum(proxy.injected.values())
    assert seen["malformed response"] >= sum(proxy.injected[k] for k in ("malformed", "short_logprobs", "nan_logprobs"))
    assert seen["server error"] >= sum(proxy.injected[k] for k in ("429", "500", "502", "503"))
    assert got.stats["failed_rollouts"] == 0 and got.stats["failure_causes"] == {}
    assert key(got) == key(want) and same_logprobs(got, want)
    ids = [(r.tree_id, r.edge_id, r.turn_index) for r in got.actor]
    assert len(ids) == len(set(ids)) == len(want.actor)  # rows lost: 0, duplicated: 0
    assert all(math.isfinite(x) for r in got.actor for x in r.logprobs)


def test_malformed_answers_with_one_call_in_flight_are_retried_and_the_batch_is_unchanged(local_model_server, clean):
    """One call in flight, the first answers of the collection malformed: the first
    request's first two, the probe's beside it (focus.backends.unreadable: another
    prompt, sent to tell the server's answer format from one request's bad answer) and
    the request's third - four in a row of one cause over two requests, one short of
    the rule that stops a collection before anything was read - then one in five at
    random. Every one is retried, the probe's answer is dropped, and the batch is the
    fault-free one."""
    from focus.backends.unreadable import Unreadable

    _, want = clean
    # seed 0: the proxy's first draw (0.84) is no fault, so the fifth answer is readable
    with FaultProxy(local_model_server.url, rate=0.2, kinds=("malformed",), seed=0) as proxy:
        proxy.queue("malformed", Unreadable.FIRST - 1)
        col = collector(proxy.url, concurrency=1)
        state, got = collect(col)
    unread = col.agent.policy.http._unread
    assert unread.probes == 1 and not unread.never_answered
    assert proxy.injected["malformed"] > Unreadable.FIRST  # faults at random too, after the queued ones
    assert got.stats["failed_rollouts"] == 0 and got.stats["failure_causes"] == {}
    assert key(got) == key(want) and same_logprobs(got, want)


@pytest.mark.parametrize("kind", KINDS)
def test_a_persistent_fault_fails_only_that_rollout_with_its_cause(local_model_server, kind):
    """The first rollout's first request gets every attempt faulted (of every run of it:
    a bad response is run again, BAD_RESPONSE_RERUNS), other requests none (a malformed
    answer to it is answered by a probe to another prompt, which reads fine: one
    request's bad answer, not the server's format); its sibling from the same root
    completes. (One failure in a wave of two is more than the default outage share,
    which would fail the wave: keep failed rollouts.) An answer
    that could not be used is a bad response, never kept: the collection stops at the
    wave, with that rollout's cause (tests/test_bad_response.py replays it)."""
    from focus.execution import BAD_RESPONSE_RERUNS, BadResponses

    evidence_only = [Phase("evidence", rollouts_per_task=2)]
    http = HTTP.model_copy(update={"max_retries": 1, "timeout_s": 0.6})
    bad = kind in ("malformed", "short_logprobs", "nan_logprobs")
    runs = 1 + BAD_RESPONSE_RERUNS if bad else 1
    with FaultProxy(local_model_server.url, hang_s=1.0) as proxy:
        proxy.queue(kind, count=2 * runs, one_request=True)  # both attempts of the first call, of every run
        col = collector(proxy.url, phases=evidence_only, concurrency=1, http=http, outage_share=1.0)
        if bad:
            with pytest.raises(BadResponses, match=r"^bad responses: 1 of 2 rollouts of phase evidence wave 0") as e:
                collect(col, n_tasks=1)
            assert proxy.pending() == 0
            failed, done = e.value.rollouts
            assert failed.leaf.cause.startswith("bad response: POST ") and "after 2 attempt(s)" in failed.leaf.cause
            assert CAUSE[kind] in failed.leaf.cause and done.leaf.kind != "failed"
            return
        state, batch = collect(col, n_tasks=1)
    (tree,) = state.trees
    leaves = [tree.nodes[tree.edges[e].child] for e in tree.root.children]
    assert leaves[0].kind == "failed" and leaves[1].kind != "failed"
    # no usable answer at all: an outage of the model service, kept as a failed rollout
    assert leaves[0].cause.startswith("model service: POST ") and "after 2 attempt(s)" in leaves[0].cause
    assert CAUSE[kind] in leaves[0].cause
    # statistics count it, with its cause
    assert batch.stats["failed_rollouts"] == 1 and batch.stats["rollouts"] == 2
    assert list(batch.stats["failure_causes"].values()) == [1]
    assert CAUSE[kind] in next(iter(batch.stats["failure_causes"]))
    # the failed rollout adds no rows and does not count as evidence for the root
    assert {r.edge_id for r in batch.actor} == {tree.root.children[1]} | {
        e.id for e in tree.edges.values() if e.parent != tree.ROOT
    }
    root_row = next(r for r in batch.critic if r.node_id == tree.ROOT)
    assert root_row.weight == 1.0  # m(root) = 1 valid child, not the 2 started


def test_a_tree_whose_evidence_failed_is_reported_not_dropped(local_model_server):
    evidence_only = [Phase("evidence", rollouts_per_task=2)]
    http = HTTP.model_copy(update={"max_retries": 1})
    with FaultProxy(local_model_server.url) as proxy:
        proxy.queue("503", count=4)  # both rollouts of the first tree, both attempts each
        col = collector(proxy.url, phases=evidence_only, concurrency=1, http=http, outage_share=1.0)
        state, batch = collect(col, n_tasks=2)
    dead, alive = state.trees
    assert all(n.kind == "failed" for n in dead.leaves()) and not dead.reaches_valid_leaf(dead.ROOT)
    assert alive.reaches_valid_leaf(alive.ROOT)
    assert batch.stats["trees"] == 2 and batch.stats["failed_rollouts"] == 2
    assert batch.stats["failed_trees"] == 1 and batch.stats["failed_tree_ids"] == [dead.task_id]
    assert batch.summary()["failed_trees"] == 1
    # its root still has a critic row, with weight 0: nothing is learned from it, visibly
    root_rows = [r for r in batch.critic if r.task_id == dead.task_id]
    assert [(r.node_id, r.weight) for r in root_rows] == [(0, 0.0)]
    assert {r.task_id for r in batch.actor} == {alive.task_id}


def sample(policy, seed: int | None = 7):
    async def go():
        try:
            return await policy.sample([256, 1, 2, 3], SamplingParams(max_tokens=6, seed=seed))
        finally:
            await policy.aclose()

    return asyncio.run(go())


def test_a_service_that_hangs_for_good_ends_the_call_at_its_deadline(local_model_server):
    """Every answer hangs past the attempt's timeout: the call gives up at its deadline,
    not after ``max_retries`` timeouts, and says so."""
    http = HttpConfig(timeout_s=0.5, max_retries=50, backoff_s=0.01, backoff_max_s=0.05, deadline_s=2.0)
    with FaultProxy(local_model_server.url, hang_s=5.0) as proxy:
        proxy.queue("timeout", count=100)
        policy = OpenAICompatPolicy(proxy.url, config=http)
        t0 = time.monotonic()
        with pytest.raises(
            PolicyError, match=r"failed after \d+ attempt\(s\) in .*\(deadline 2 s\); last: no status: timeout"
        ):
            sample(policy)
        elapsed = time.monotonic() - t0
    # the deadline bounds the call, read from its attempts, not wall time (a loaded machine
    # is slow): each lasts its 0.5 s timeout at least, so 2 s hold 4 and the one cut short;
    # 51 without the deadline (25 s). Timers never fire early: not before the deadline.
    assert elapsed >= 2.0 - 0.05
    stats = policy.stats()
    assert stats["deadline_exceeded"] == 1 and stats["failed_calls"] == {"timeout": 1}
    assert 2 <= stats["retries"]["timeout"] == stats["attempts"] - 1 <= 4, stats
    assert sum(stats["lost_s"].values()) == pytest.approx(elapsed, abs=0.5)


@pytest.mark.integration  # starts a server
def test_hedging_past_a_hang_on_the_simulated_server_returns_the_same_tokens():
    """The simulated server samples from the request's seed, so a hedge sent while the
    first copy hangs in the proxy answers exactly what the first would have."""
    from focus.testing.simserver import SimConfig, SimServerProcess

    plain = HTTP.model_copy(update={"timeout_s": 5.0})
    with SimServerProcess(SimConfig(latency_s=0.01, completion_tokens=5)) as sim:
        want = [sample(OpenAICompatPolicy(sim.url, config=plain), seed=s) for s in (7, 8)]
        with FaultProxy(sim.url, hang_s=4.0) as proxy:
            proxy.queue("timeout")  # the first copy of the first call hangs past the hedge
            policy = OpenAICompatPolicy(proxy.url, config=plain.model_copy(update={"hedge_after_s": 1.0}))
            got = [sample(policy, seed=s) for s in (7, 8)]
            requests = proxy.requests
    assert [(c.token_ids, c.logprobs) for c in got] == [(c.token_ids, c.logprobs) for c in want]
    assert [c.meta["http"].hedges for c in got] == [1, 0] and got[0].meta["http"].hedge_won
    assert requests == 3  # two copies of the first call, one of the second
    stats = policy.stats()
    assert (stats["calls"], stats["attempts"], stats["hedges"], stats["hedge_wins"], stats["retries"]) == (
        2,
        2,
        1,
        1,
        {},
    )
