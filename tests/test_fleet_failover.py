"""FleetPolicy's failover and waits, over mock replicas (unit tests of one piece).

Each replica is an OpenAICompatPolicy over an ``httpx.MockTransport`` that answers, or
refuses connections while it is "down". The real thing - simulated servers in their own
processes, one killed with SIGKILL mid-collection - is tests/test_fleet.py.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest

from focus.backends import FleetPolicy, HttpConfig, OpenAICompatPolicy
from focus.backends.routing import RoundRobin
from focus.policy import ReplicasDiffer, SamplingParams, ServiceUnavailable
from focus.testing import run

HTTP = HttpConfig(max_retries=2, backoff_s=0.005, backoff_max_s=0.02, timeout_s=5, outage_wait_s=5)
PARAMS = SamplingParams(max_tokens=4, seed=1)


class Replica:
    def __init__(self, version: str = "w1") -> None:
        self.down_until = 0.0
        self.version = version
        self.answered = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        if time.monotonic() < self.down_until:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m", "policy_version": self.version}]})
        self.answered += 1
        ids = [65, 66]
        choice = {
            "token_ids": ids,
            "finish_reason": "length",
            "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5, -0.5]},
        }
        usage = {"prompt_tokens_details": {"cached_tokens": 1}}
        return httpx.Response(200, json={"policy_version": self.version, "choices": [choice], "usage": usage})

    def policy(self, url: str) -> OpenAICompatPolicy:
        return OpenAICompatPolicy(url, vocab_size=300, config=HTTP, transport=httpx.MockTransport(self.handler))


def fleet(replicas: list[Replica], **kw) -> FleetPolicy:  # type: ignore[no-untyped-def]
    return FleetPolicy([r.policy(f"http://replica{i}.invalid") for i, r in enumerate(replicas)], **kw)


async def calls(policy: FleetPolicy, n: int, route=("t", 1)) -> list:  # type: ignore[no-untyped-def]
    try:
        return [await policy.sample_on_route([256, 1, 2], PARAMS, route) for _ in range(n)]
    finally:
        await policy.aclose()


def test_a_down_replica_is_set_aside_its_calls_go_elsewhere_and_it_comes_back():
    a, b = Replica(), Replica()
    policy = fleet([a, b], router=RoundRobin(), down_s=0.2)

    async def go() -> None:
        try:
            await policy.sample([256, 1], PARAMS)  # verified, both up
            a.down_until = time.monotonic() + 0.3
            for _ in range(6):  # every call answered: those that meet replica 0 fail over to 1
                await policy.sample([256, 1], PARAMS)
            await asyncio.sleep(0.4)  # a is back and its down time has passed: it gets a call again
            for _ in range(4):
                await policy.sample([256, 1], PARAMS)
        finally:
            await policy.aclose()

    run(go())
    stats = policy.stats()
    # set aside at its first failure (a slow machine may have it probed once more while still down)
    assert 1 <= stats["replicas"][0]["failovers"] == stats["failovers"] <= 2
    assert stats["calls"] == 11 and stats["replicas"][0]["calls"] >= 2  # it answered again at the end
    assert stats["replicas"][1]["cached_tokens"] == stats["replicas"][1]["calls"]  # as the server reported


def test_when_every_replica_is_down_the_calls_wait_for_one():
    a, b = Replica(), Replica()
    policy = fleet([a, b])

    async def go() -> list:  # type: ignore[type-arg]
        await policy.verify()
        a.down_until = b.down_until = time.monotonic() + 0.5
        return await calls(policy, 3)

    assert len(run(go())) == 3 and policy.stats()["outages"] == 1


def test_past_the_window_every_replica_down_fails_as_an_outage():
    a, b = Replica(), Replica()
    policy = FleetPolicy([r.policy(f"http://r{i}.invalid") for i, r in enumerate((a, b))])
    for r in policy.replicas:
        r.http.config = r.http.config.model_copy(update={"outage_wait_s": 0.3})

    async def go() -> None:
        await policy.verify()
        a.down_until = b.down_until = time.monotonic() + 60
        await calls(policy, 1)

    with pytest.raises(ServiceUnavailable, match=r"every replica of the model .* has been down for"):
        run(go())


def test_a_replica_answering_with_other_weights_is_set_aside_and_its_calls_go_elsewhere(caplog):
    """Its answer failed the call as a bad response: the rollout ran again, on that
    replica or another, and the collection went on or stopped as an outage by chance."""
    a, b = Replica(), Replica()
    policy = fleet([a, b], router=RoundRobin())

    async def go() -> list:  # type: ignore[type-arg]
        await policy.verify()
        b.version = "w2"  # restarted on another checkpoint
        return await calls(policy, 6)

    with caplog.at_level(logging.WARNING, logger="focus.backends.fleet"):
        answers = run(go())
    assert [c.policy_version for c in answers] == ["w1"] * 6 and policy.policy_version == "w1"
    stats = policy.stats()["replicas"]
    assert b.answered == 1 and stats[1]["calls"] == 0 and stats[1]["failovers"] == 1 and stats[0]["calls"] == 6
    lines = [r.getMessage() for r in caplog.records]
    assert len([m for m in lines if "answers with weights w2, the others' are w1" in m]) == 1, lines
    assert "replica http://replica1.invalid of the model answers with weights w2" in lines[0]


def test_when_every_replica_answers_with_other_weights_the_collection_stops():
    a, b = Replica(), Replica()
    policy = fleet([a, b], router=RoundRobin())

    async def go() -> None:
        await policy.verify()
        a.version = b.version = "w2"
        await calls(policy, 2)

    with pytest.raises(ReplicasDiffer, match=r"every replica of the model now answers with other weights than w1"):
        run(go())


def test_a_replica_back_with_other_weights_is_not_announced_as_back(caplog):
    a, b = Replica(), Replica()
    policy = fleet([a, b], router=RoundRobin(), down_s=0.05)

    async def go() -> None:
        await policy.verify()
        b.down_until = float("inf")  # down until told otherwise (a time window closes early on a loaded machine)
        await calls(policy, 2)  # b found down on its turn; both answered by a
        b.version, b.down_until = "w2", 0.0  # restarted on another checkpoint
        await asyncio.sleep(0.2)
        await calls(policy, 4)

    with caplog.at_level(logging.WARNING, logger="focus.backends.fleet"):
        run(go())
    lines = [r.getMessage() for r in caplog.records]
    assert any("replica1.invalid of the model is down" in m for m in lines)
    assert any("replica1.invalid of the model answers with weights w2" in m for m in lines)
    assert not any("answers again" in m for m in lines), lines


def test_replicas_that_differ_are_a_setting_to_fix_exit_2():
    from flows.errors import exit_code

    assert exit_code(ReplicasDiffer("the model's replicas serve different weights (...)")) == 2
