"""A model service that accepts connections and never answers is told within a bounded
time: one warning line naming the URL and how many requests wait, after
``silence_warn_s`` (checked every quarter of it). It was silent until every call's
``deadline_s`` (600 s): a timeout does not count as the service being down, so the
outage gate never spoke. Nothing is said while answers flow."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest

from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.backends.outage import OutageGate
from focus.env import Message
from focus.format import ByteCodec
from focus.policy import SamplingParams, ServiceUnavailable
from focus.testing.faults import FaultProxy
from focus.toy import opening_text

pytestmark = pytest.mark.timeout(60)

PROMPT = ByteCodec().render([Message("user", opening_text(4))])


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_the_silence_is_warned_once_and_never_while_answers_flow(caplog):
    async def go() -> None:  # the gate's Event needs a loop
        gate = OutageGate(0.0, service="model service", url="http://m")
        t = 100.0
        for _ in range(40):  # an answer every 0.9 s, requests always waiting: never 1 s of silence
            gate.answered(t - 0.5, t)
            gate.look(t + 0.45, 8, t - 0.2, 1.0, "x")
            t += 0.9
        assert gate.silent_since is None
        gate.look(t + 0.5, 0, None, 1.0, "x")  # nothing waits: nothing to say
        gate.look(t + 5.0, 3, t + 4.5, 1.0, "x")  # waiting since t + 4.5: 0.5 s
        assert gate.silent_since is None
        gate.look(t + 5.6, 3, t + 4.5, 1.0, "x")
        gate.look(t + 7.0, 3, t + 4.5, 1.0, "x")  # once only
        gate.answered(t + 6.0, t + 7.5)
        gate.look(t + 8.0, 3, t + 7.6, 1.0, "x")

    with caplog.at_level(logging.WARNING, logger="focus.backends.outage"):
        asyncio.run(go())
    assert _lines(caplog, "no answer has come") == [
        "no answer has come from the model service at http://m for 1.1 s; 3 request(s) wait (silence_warn_s = 1 s; x)"
    ]
    assert _lines(caplog, "answers again") == ["model service at http://m answers again after 3 s without an answer"]


@pytest.mark.integration
def test_a_server_that_never_answers_is_named_after_silence_warn_s(local_model_server, caplog):
    cfg = HttpConfig(silence_warn_s=1.0, timeout_s=2.5, deadline_s=3.5, outage_wait_s=0, adaptive_hedge=False)
    with FaultProxy(local_model_server.url, rate=1.0, kinds=("timeout",), hang_s=30) as proxy:
        policy = OpenAICompatPolicy(proxy.url, config=cfg)

        async def go() -> list[object]:
            try:
                calls = [policy.sample(PROMPT, SamplingParams(max_tokens=4, seed=s)) for s in range(3)]
                return await asyncio.gather(*calls, return_exceptions=True)
            finally:
                await policy.aclose()

        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="focus.backends.outage"):
            out = asyncio.run(go())
        took = time.monotonic() - t0
    assert all(isinstance(e, ServiceUnavailable) for e in out), out
    (line,) = _lines(caplog, "no answer has come")
    assert re.match(
        rf"no answer has come from the model service at {re.escape(proxy.url)} for 1(\.\d)? s; 3 request\(s\) wait ",
        line,
    ), line
    assert "timeout_s = 2.5 s" in line and "deadline_s = 3.5" in line
    (record,) = [r for r in caplog.records if "no answer has come" in r.getMessage()]
    assert record.focus_console  # the focus command shows it in quiet mode too
    assert took >= 3.5


@pytest.mark.integration
def test_a_server_that_answers_only_429_is_named_after_silence_warn_s(local_model_server, caplog):
    """A service that throttles every request (429, or any retryable status) answers at
    once, and each call spends its time in the backoff between attempts, where no request
    is in flight: the watch saw none waiting and said nothing until the calls gave up
    (106 s of silence for `focus collect` with the default retries behind a 429 with
    `Retry-After: 3600`). Calls backing off count as waiting now, and the line says what
    the service answers. (With an outage window, a 429 to every request is waited for at
    the outage gate instead, named by its own line: tests/test_gateway_answers.py; here
    none, so that the calls back off as for any other retried status.)"""
    cfg = HttpConfig(
        silence_warn_s=0.4,
        max_retries=6,
        backoff_s=0.25,
        backoff_max_s=0.25,
        jitter=False,
        adaptive_hedge=False,
        outage_wait_s=0,
    )
    with FaultProxy(local_model_server.url, rate=1.0, kinds=("429",)) as proxy:
        policy = OpenAICompatPolicy(proxy.url, config=cfg)

        async def go() -> object:
            try:
                return await policy.sample(PROMPT, SamplingParams(max_tokens=4, seed=0))
            except ServiceUnavailable as e:
                return e
            finally:
                await policy.aclose()

        with caplog.at_level(logging.WARNING, logger="focus.backends.outage"):
            out = asyncio.run(go())
    assert isinstance(out, ServiceUnavailable), out
    (line,) = _lines(caplog, "no usable answer has come")
    assert line.startswith(f"no usable answer has come from the model service at {proxy.url} for "), line
    assert "; 1 request(s) wait, retried after each answer (the last: status 429" in line, line
