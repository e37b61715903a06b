"""What a gateway in front of the model server answers, read for what it says.

A gateway or proxy (LiteLLM, a cloud load balancer, an API gateway) passes the model
server's refusals on with a status of its own, and adds its own rate limit. Each test's
server is on 127.0.0.1 (``tests/fixtures/scripted.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.policy import ContextLimit, SamplingParams, ServiceUnavailable
from focus.refusals import refused_opening

pytestmark = pytest.mark.integration  # starts a server

PROMPT = [256, 10, 11, 12]
#: Quick retries: the test is about which answers are retried, not how long.
QUICK = {"max_retries": 3, "backoff_s": 0.001, "backoff_max_s": 0.01, "outage_wait_s": 0, "adaptive_hedge": False}

#: vLLM's words for a prompt over the context (``serving_engine``), and its engine's.
VLLM = (
    "This model's maximum context length is 4096 tokens. However, you requested 4112 tokens (4104 in the messages, "
    "8 in the completion). Please reduce the length of the messages or completion."
)
ENGINE = "The decoder prompt (length 5000) is longer than the maximum model length of 4096."


def answer(ids=(5, 6)) -> dict:
    return {
        "model": "m",
        "choices": [
            {
                "index": 0,
                "token_ids": list(ids),
                "finish_reason": "length",
                "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5] * len(ids)},
            }
        ],
    }


def _sample(url: str, **http: object) -> object:
    policy = OpenAICompatPolicy(url, config=HttpConfig(**{**QUICK, **http}))  # type: ignore[arg-type]

    async def go() -> object:
        try:
            return await policy.sample(PROMPT, SamplingParams(max_tokens=8, seed=1))
        except Exception as e:  # noqa: BLE001 - the test looks at which
            return e
        finally:
            await policy.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, {"object": "error", "message": VLLM, "type": "BadRequestError", "code": 400}),
        (502, {"error": {"message": f"litellm.BadRequestError: Hosted_vllmException - {VLLM}", "code": "502"}}),
        (503, {"error": {"message": ENGINE}}),
        (500, {"error": {"message": "prompt is too long: 5000 tokens > 4096 maximum"}}),
    ],
)
def test_a_gateways_5xx_carrying_the_context_refusal_ends_the_episode_as_a_400_would(scripted, status, body):
    """A 500 (or a gateway's 502/503) whose body is vLLM's context refusal was retried as
    a server error (the same refusal every time) and failed the rollout as an outage;
    it is the :class:`ContextLimit` a 400 with those words is, at the first answer."""
    scripted.answers[:] = [(status, {}, body)]
    out = _sample(scripted.url)
    assert isinstance(out, ContextLimit), out
    assert f"was rejected with status {status}: " in str(out), out
    assert len(scripted.paths) == 1  # not retried
    # the pipeline reads a failed leaf's cause the same way (a task's opening prompt over the context)
    assert refused_opening("failed", 0, f"model: {out}")


@pytest.mark.parametrize(
    "said",
    [
        "CUDA error: an illegal memory access was encountered",
        "Engine loop has died",
        "context length: internal error while scheduling",  # words a 400 would be read by, but not vLLM's refusal
    ],
)
def test_a_5xx_that_does_not_say_so_is_still_a_server_error(scripted, said):
    scripted.answers[:] = [(500, {}, {"error": {"message": said}}), (200, {}, answer())]
    out = _sample(scripted.url)
    assert not isinstance(out, Exception), out
    assert len(scripted.paths) == 2  # retried, and the retry answered


def test_the_context_refusal_with_a_4xx_status_that_is_retried_stays_retried(scripted):
    """A 429 naming the context (a rate limit on tokens per minute) is a rate limit."""
    scripted.answers[:] = [(429, {}, {"error": {"message": VLLM}}), (200, {}, answer())]
    out = _sample(scripted.url)
    assert not isinstance(out, Exception), out
    assert len(scripted.paths) == 2


# ---- a gateway's rate limit (429) ----


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "focus.backends.outage"]


def _gather(url: str, n: int, **http: object) -> tuple[list[object], float]:
    policy = OpenAICompatPolicy(url, config=HttpConfig(**{**QUICK, **http}))  # type: ignore[arg-type]

    async def one(seed: int) -> object:
        try:
            return await policy.sample(PROMPT, SamplingParams(max_tokens=8, seed=seed))
        except Exception as e:  # noqa: BLE001 - the test looks at which
            return e

    async def go() -> tuple[list[object], float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            return list(await asyncio.gather(*(one(s) for s in range(n)))), loop.time() - t0
        finally:
            await policy.aclose()

    return asyncio.run(go())


class Throttled:
    """A gateway on 127.0.0.1 that answers every request 429 with ``Retry-After`` until
    ``for_s`` after its first request (None: for ever), then passes answers on; with
    ``odd_seeds``, only the requests of an odd seed (it admits the others)."""

    def __init__(self, retry_after: float, for_s: float | None, odd_seeds: bool = False) -> None:
        self.retry_after, self.for_s, self.odd_seeds = retry_after, for_s, odd_seeds
        self.arrivals: list[tuple[float, int]] = []
        self.start: float | None = None
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                seed = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["seed"]
                now = time.monotonic()
                gateway.start = now if gateway.start is None else gateway.start
                limited = gateway.for_s is None or now < gateway.start + gateway.for_s
                limited = limited and (seed % 2 == 1 or not gateway.odd_seeds)
                status, body = (429, {"error": {"message": "Rate limit exceeded"}}) if limited else (200, answer())
                gateway.arrivals.append((now, status))
                data = json.dumps(body).encode()
                self.send_response(status)
                if limited:
                    self.send_header("Retry-After", f"{gateway.retry_after:g}")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Throttled:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def test_a_rate_limit_longer_than_the_retries_is_waited_for_honouring_retry_after(caplog):
    """A gateway throttling every request for longer than the quick retries failed every
    call after them (its ``Retry-After`` was honoured up to ``backoff_max_s`` only, and a
    429 was no outage); the calls wait, one warning line says so, and no request goes
    before the ``Retry-After`` the gateway asked for."""
    with Throttled(retry_after=0.4, for_s=1.2) as gateway, caplog.at_level(logging.WARNING):
        out, took = _gather(gateway.url, 4, outage_wait_s=10)
    assert not [o for o in out if isinstance(o, Exception)], out
    assert [o.token_ids for o in out] == [(5, 6)] * 4  # type: ignore[attr-defined]
    assert took >= 1.2
    limited = [t for t, status in gateway.arrivals if status == 429]
    probes = limited[4:]  # after each call's first request, one request at a time
    assert all(b - a >= 0.4 - 0.02 for a, b in zip(limited[3:], probes, strict=False)), gateway.arrivals
    waits = [line for line in _lines(caplog) if "status 429 (rate limited)" in line]
    assert len(waits) == 1, _lines(caplog)  # one line, not one per call
    assert waits[0].startswith(f"model service at {gateway.url} has answered every request with status 429"), waits
    assert "outage_wait_s" in waits[0] and "Retry-After" in waits[0]
    assert sum("answers again" in line for line in _lines(caplog)) == 1


def test_a_rate_limit_past_outage_wait_s_stops_with_the_outage_line_and_no_early_request(caplog):
    """A ``Retry-After`` longer than the window: nothing is sent again before it, and the
    calls stop when ``outage_wait_s`` is spent, with the outage line naming the limit."""
    with Throttled(retry_after=30, for_s=None) as gateway, caplog.at_level(logging.WARNING):
        out, took = _gather(gateway.url, 3, outage_wait_s=1.0)
    assert all(isinstance(o, ServiceUnavailable) for o in out), out
    assert 1.0 - 0.05 <= took < 5, took
    assert len(gateway.arrivals) == 3  # each call's first request; the gateway asked for 30 s
    line = str(out[0])
    assert "has answered every request with status 429 (rate limited) for " in line, line
    assert "(waited for it up to outage_wait_s = 1 s)" in line and "last: status 429" in line, line
    assert sum("status 429 (rate limited)" in line for line in _lines(caplog)) == 1


def _beside_others(url: str, **http: object) -> tuple[object, float]:
    """One call (seed 1) while other calls (even seeds) are answered one after another
    (``backoff_max_s`` 1 s: a probe interval of 1 s, the default, that tells "answered a
    moment ago")."""
    policy = OpenAICompatPolicy(url, config=HttpConfig(**{**QUICK, "backoff_max_s": 1.0, **http}))  # type: ignore[arg-type]

    async def go() -> tuple[object, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await policy.sample(PROMPT, SamplingParams(max_tokens=8, seed=0))  # the service answers
        call = asyncio.ensure_future(policy.sample(PROMPT, SamplingParams(max_tokens=8, seed=1)))
        seed = 2
        try:
            while not call.done():  # the gateway admits these: the service answers
                await policy.sample(PROMPT, SamplingParams(max_tokens=8, seed=seed))
                seed += 2
                await asyncio.sleep(0.02)
            try:
                return call.result(), loop.time() - t0
            except Exception as e:  # noqa: BLE001 - the test looks at which
                return e, loop.time() - t0
        finally:
            await policy.aclose()

    return asyncio.run(go())


def test_a_call_a_rate_limit_refuses_while_others_are_answered_retries_up_to_outage_wait_s(caplog):
    """A gateway that admits a share of the calls: the service answers, so the refused
    call does not wait at the outage gate, and it failed after its retries (10 by
    default, about 100 s with the Retry-After capped at backoff_max_s); it retries on,
    honouring the Retry-After, up to outage_wait_s, with one warning line."""
    with Throttled(retry_after=0.1, for_s=1.0, odd_seeds=True) as gateway, caplog.at_level(logging.WARNING):
        out, took = _beside_others(gateway.url, outage_wait_s=10)
    assert not isinstance(out, Exception), out
    assert out.token_ids == (5, 6) and took >= 1.0  # type: ignore[attr-defined]
    refused = [t for t, status in gateway.arrivals if status == 429]
    assert len(refused) > QUICK["max_retries"] + 1  # past its retries
    assert all(b - a >= 0.1 - 0.02 for a, b in zip(refused, refused[1:], strict=False)), refused  # its Retry-After
    lines = [line for line in _lines(caplog) if "status 429" in line]
    assert len(lines) == 1 and "answers some requests with status 429 (rate limited)" in lines[0], _lines(caplog)


def test_a_call_a_rate_limit_refuses_for_longer_than_outage_wait_s_stops_naming_it():
    with Throttled(retry_after=0.1, for_s=None, odd_seeds=True) as gateway:
        out, took = _beside_others(gateway.url, outage_wait_s=0.6)
    assert isinstance(out, ServiceUnavailable), out
    assert 0.6 - 0.05 <= took < 5, took
    line = str(out)
    assert "answered it with status 429 (rate limited) for " in line, line
    assert "(retried up to outage_wait_s = 0.6 s); last: status 429" in line, line
