"""What a gateway in front of the model server answers, read for what it says.

A gateway or proxy (LiteLLM, a cloud load balancer, an API gateway) passes the model
server's refusals on with a status of its own, and adds its own rate limit. Each test's
server is on 127.0.0.1 (``tests/fixtures/scripted.py``).
"""

from __future__ import annotations

import asyncio
import logging

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
