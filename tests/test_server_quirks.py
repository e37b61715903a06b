"""The clients against quirks of real servers' answers that no stand-in gave before,
each from a server on 127.0.0.1 inside the test.

* SGLang's sampler writes the log of a probability of 0 as the lowest float32
  (``torch.log(probs).clamp(min=torch.finfo(probs.dtype).min)`` in
  ``python/sglang/srt/layers/sampler.py``, "to avoid -inf"), where vLLM writes
  ``-9999.0`` and llama-server the lowest float too: on a sampled token it is no
  behaviour log-prob, and ``/generate``'s answer carrying it was recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from focus.backends import HttpConfig, SGLangPolicy
from focus.policy import PolicyError, SamplingParams, UnreadableAnswers

pytestmark = [pytest.mark.timeout(60), pytest.mark.integration]  # loopback servers; fast, not slow

#: Short retries, no read timeout a slow machine could miss.
FAST = HttpConfig(backoff_s=0.001, backoff_max_s=0.005, max_retries=6, timeout_s=30, outage_wait_s=0)
PARAMS = SamplingParams(max_tokens=3, seed=7)
#: ``torch.finfo(torch.float32).min``, as SGLang's JSON writes it.
LOWEST_FLOAT32 = -3.4028234663852886e38


@asynccontextmanager
async def aiohttp_server(handle: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """``handle`` answering every POST on 127.0.0.1; yields the server's root URL."""
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def sglang_answer(ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """``/generate``'s answer as SGLang's tokenizer manager writes it (return_logprob on)."""
    meta = {
        "id": "0c7e",
        "finish_reason": {"type": "length", "length": len(ids)},
        "prompt_tokens": 3,
        "weight_version": "default",
        "completion_tokens": len(ids),
        "cached_tokens": 0,
        "e2e_latency": 0.01,
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids, strict=True)],
    }
    return {"text": "abc", "output_ids": ids, "meta_info": meta}


def test_sglangs_lowest_float_log_prob_on_a_sampled_token_is_refused_not_recorded():
    """The second sampled token's log-prob is SGLang's clamp of -inf: every answer
    carries it, so the client stops with the line naming it; no completion comes back
    (before, the answer was returned with a behaviour log-prob of -3.4e38)."""
    sent: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        sent.append(await request.json())
        return web.json_response(sglang_answer([65, 66, 67], [-0.5, LOWEST_FLOAT32, -1.25]))

    async def go() -> Any:
        async with aiohttp_server(handle) as url:
            policy = SGLangPolicy(url, config=FAST)
            try:
                return await policy.sample([1, 2, 3], PARAMS)
            finally:
                await policy.aclose()

    with pytest.raises(PolicyError) as caught:
        asyncio.run(go())
    assert isinstance(caught.value, UnreadableAnswers), caught.value
    line = str(caught.value)
    assert "log-prob -3.4028234663852886e+38 of sampled token 1 is a stand-in for -inf (SGLang clamps" in line, line
    assert sent and all(b["return_logprob"] is True for b in sent)


def test_sglangs_completions_name_no_vllm_for_the_lowest_float():
    """The same value on an OpenAI-compatible answer (SGLang's ``/v1/completions``) is
    refused as before, without calling it vLLM's (whose stand-in is -9999.0)."""
    from focus.backends.openai_compat import MalformedResponse, parse_completion

    answer = {
        "choices": [
            {
                "index": 0,
                "logprobs": {"token_logprobs": [-0.5, LOWEST_FLOAT32], "tokens": ["a", "b"]},
                "token_ids": [65, 66],
                "finish_reason": "length",
            }
        ],
        "metadata": {"weight_version": "default"},
    }
    with pytest.raises(MalformedResponse, match=r"sampled token 1 is a stand-in for -inf") as caught:
        parse_completion(answer)
    assert "vLLM" not in str(caught.value).split("(see")[0]
