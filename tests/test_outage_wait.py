"""A model service that stops answering is waited for, not failed (the client's side).

Unit tests of one piece: the outage gate's decisions, and the HTTP client over an
``httpx.MockTransport`` whose service goes down and comes back on a clock. The real
thing - the embedded server killed and restarted mid-collection - is tests/test_restart.py.
"""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest

from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.backends.outage import OVER, PROBE, UP, OutageGate, is_down_cause, span
from focus.policy import SamplingParams, ServiceUnavailable
from focus.testing import run

PROMPT = [256, 10, 11, 12]
#: Ordinary retries spent in well under a second; the outage window is what differs.
QUICK = {"max_retries": 2, "backoff_s": 0.005, "backoff_max_s": 0.02, "timeout_s": 5.0}


def answer(ids=(5, 6)) -> dict:
    return {
        "model": "m",
        "choices": [
            {
                "token_ids": list(ids),
                "finish_reason": "length",
                "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids)},
            }
        ],
    }


class Service:
    """A mock model service that is down (refused, or a status) between two times."""

    def __init__(self, failure: str = "refused") -> None:
        self.down_from = self.down_until = float("inf")
        self.failure = failure
        self.requests = 0
        self.refused = 0

    def go_down(self, for_s: float | None) -> None:
        self.down_from = time.monotonic()
        self.down_until = float("inf") if for_s is None else self.down_from + for_s

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.down_from <= time.monotonic() < self.down_until:
            self.refused += 1
            if self.failure == "refused":
                raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
            return httpx.Response(int(self.failure), json={"error": "restarting"})
        return httpx.Response(200, json=answer())

    def policy(self, **http: float) -> OpenAICompatPolicy:
        config = HttpConfig(**{**QUICK, **http})
        return OpenAICompatPolicy("http://model.invalid", config=config, transport=httpx.MockTransport(self.handler))


async def sample(policy: OpenAICompatPolicy, n: int = 1, seed: int = 0) -> list:
    params = SamplingParams(max_tokens=4, seed=seed)
    return list(await asyncio.gather(*(policy.sample(PROMPT, params.with_seed(seed + i)) for i in range(n))))


# ---- the gate's decisions ----


def test_only_a_service_that_answers_nobody_is_waited_for_and_only_past_the_retries():
    async def go() -> None:
        gate = OutageGate(30.0, service="model service", url="http://m")
        t = time.monotonic()
        kw = {"streak_start": t, "retries_left": False, "down_cause": True}
        assert gate.should_wait(**kw)
        assert not gate.should_wait(**{**kw, "retries_left": True})  # the ordinary retries first
        assert not gate.should_wait(**{**kw, "down_cause": False})  # e.g. a timeout or a 500
        gate.answered(t - 0.5, t + 0.5)  # sent before this call began failing: says nothing of now
        assert gate.should_wait(**kw)
        gate.answered(t + 0.5, t + 0.6)  # sent and answered after this call began failing: the service is up
        assert not gate.should_wait(**kw)
        assert not OutageGate(0.0, service="s", url="u").should_wait(**kw)  # window 0: off
        gate.failed(t + 1)
        gate._announce("connection")  # calls are waiting: any retryable failure of a new call joins them
        assert gate.should_wait(streak_start=t + 2, retries_left=True, down_cause=False)

    run(go())


def test_waiting_calls_probe_in_turn_wake_together_and_stop_at_the_window():
    async def go() -> None:
        gate = OutageGate(0.3, service="model service", url="http://m", probe_s=0.1)
        gate.failed(time.monotonic())
        assert await gate.wait(None, "refused") == PROBE  # the first waiter probes at once
        waiters = [asyncio.ensure_future(gate.wait(None, "refused")) for _ in range(3)]
        await asyncio.sleep(0.12)
        assert sum(w.done() for w in waiters) == 1  # one probe per probe_s, not one per waiter
        gate.answered(time.monotonic(), time.monotonic())
        assert sorted(await asyncio.gather(*waiters)) == [PROBE, UP, UP]
        assert gate.totals.outages == 1
        gate.failed(time.monotonic())
        t0 = time.monotonic()
        while (turn := await gate.wait(None, "refused")) == PROBE:
            pass
        assert turn == OVER and time.monotonic() - t0 >= 0.3 - 0.01
        gate.failed(time.monotonic())
        assert await gate.wait(time.monotonic() - 1, "refused") == OVER  # the call's deadline ends it too

    run(go())


def test_down_causes():
    assert is_down_cause("connection", None)
    assert all(is_down_cause("server error", s) for s in (502, 503, 504))
    assert is_down_cause("server error", 429)  # a rate limit: no request is taken now (test_gateway_answers.py)
    assert not is_down_cause("server error", 500)
    assert not is_down_cause("timeout", None) and not is_down_cause("malformed response", 200)


def test_the_lines_give_a_duration_under_a_second_rather_than_0_s(caplog):
    """A client with quick retries enters the wait a fraction of a second after the first
    failure: the lines said "has not answered for 0 s" and "answers again after 0 s"."""

    async def go() -> None:
        gate = OutageGate(30.0, service="model service", url="http://m")
        gate.failed(time.monotonic() - 0.3)
        gate._announce("connection refused")
        gate.answered(time.monotonic(), gate.down_since + 0.6)  # type: ignore[operator]

    with caplog.at_level(logging.WARNING, logger="focus.backends.outage"):
        run(go())
    wait, back = (r.getMessage() for r in caplog.records)
    assert "has not answered for 0.3 s (connection refused)" in wait, wait
    assert "answers again after 0.6 s;" in back, back
    assert [span(s) for s in (0.0, 0.04, 0.06, 0.5, 1.0, 2.46, 9.94, 9.96, 61.4)] == [
        "under 0.1 s",
        "under 0.1 s",
        "0.1 s",
        "0.5 s",
        "1 s",
        "2.5 s",
        "9.9 s",
        "10 s",
        "61 s",
    ]


# ---- the client ----


@pytest.mark.parametrize("failure", ["refused", "503", "502"])
def test_calls_in_flight_wait_out_a_restart_and_are_answered(failure, caplog):
    service = Service(failure)
    policy = service.policy(outage_wait_s=30.0)

    async def go() -> list:
        try:
            await sample(policy)  # the service has answered this client
            service.go_down(1.0)
            return await sample(policy, n=8, seed=10)
        finally:
            await policy.aclose()

    with caplog.at_level(logging.WARNING, logger="focus.backends.outage"):
        t0 = time.monotonic()
        completions = run(go())
        elapsed = time.monotonic() - t0
    assert len(completions) == 8 and all(c.token_ids == (5, 6) for c in completions)
    assert elapsed >= 1.0  # they waited for it ...
    stats = policy.stats()
    assert stats["outages"] == 1 and stats["failed_calls"] == {} and stats["calls"] == 9
    # ... probing about every backoff_max_s (20 ms) rather than each call on its own
    assert service.refused < 8 * (QUICK["max_retries"] + 1) + 1.0 / 0.02 + 10
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "model service at http://model.invalid has not answered for" in lines[0] and "up to 30 s" in lines[0]
    assert "answers again after 1 s" in lines[1]


def test_past_the_window_the_calls_fail_as_an_outage_naming_the_wait():
    service = Service()
    policy = service.policy(outage_wait_s=0.5)

    async def go() -> None:
        try:
            await sample(policy)
            service.go_down(None)
            await sample(policy, n=4, seed=10)
        finally:
            await policy.aclose()

    t0 = time.monotonic()
    with pytest.raises(
        ServiceUnavailable,
        match=r"has not answered for (0\.[5-9]|[1-9](\.\d)?) s \(waited for it up to outage_wait_s = 0.5",
    ):
        run(go())
    assert 0.5 <= time.monotonic() - t0 < 10


def test_a_service_not_up_yet_is_waited_for_like_a_restart():
    """A collection started while its server still loads weights: waited for, not failed."""
    service = Service()
    service.go_down(1.0)
    policy = service.policy(outage_wait_s=30.0)

    async def go() -> list:
        try:
            return await sample(policy, n=3)
        finally:
            await policy.aclose()

    assert len(run(go())) == 3 and policy.stats()["outages"] == 1


def test_outage_wait_zero_fails_within_the_ordinary_retries():
    service = Service()
    service.go_down(None)
    policy = service.policy(outage_wait_s=0.0)

    async def go() -> None:
        try:
            await sample(policy)
        finally:
            await policy.aclose()

    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable, match=r"failed after 3 attempt\(s\); last: no status: connection"):
        run(go())
    assert time.monotonic() - t0 < 5 and service.requests == 3


def test_a_request_that_fails_while_others_are_answered_spends_its_retries():
    """The service is up (other calls are answered): a request it keeps refusing is the
    request's problem, not an outage, and fails after its retries."""
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if b'"seed":666' in request.content:
            return httpx.Response(503, json={"error": "this one never"})
        return httpx.Response(200, json=answer())

    policy = OpenAICompatPolicy(
        "http://model.invalid", config=HttpConfig(**QUICK, outage_wait_s=300.0), transport=httpx.MockTransport(handler)
    )

    async def go() -> None:
        try:
            await sample(policy)

            async def others() -> None:
                for i in range(200):
                    await sample(policy, seed=i)
                    await asyncio.sleep(0.001)

            background = asyncio.ensure_future(others())
            try:
                await policy.sample(PROMPT, SamplingParams(max_tokens=4, seed=666))
            finally:
                background.cancel()
        finally:
            await policy.aclose()

    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable, match=r"failed after 3 attempt\(s\); last: status 503"):
        run(go())
    assert time.monotonic() - t0 < 5


def test_the_window_is_a_pipeline_setting():
    from tasks.config import load_config

    base = {"model.kind": "openai", "model.url": "http://model.invalid"}
    assert load_config(overrides=base, environ={}).build_policy().http.config.outage_wait_s == 300.0  # the default
    cfg = load_config(overrides=base, environ={"FOCUS_MODEL__HTTP__OUTAGE_WAIT_S": "120"})
    assert cfg.model.http.outage_wait_s == 120.0 and cfg.build_policy().http.config.outage_wait_s == 120.0
