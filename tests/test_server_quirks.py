"""The clients against quirks of real servers' answers that no stand-in gave before,
each from a server on 127.0.0.1 inside the test.

* SGLang's sampler writes the log of a probability of 0 as the lowest float32
  (``torch.log(probs).clamp(min=torch.finfo(probs.dtype).min)`` in
  ``python/sglang/srt/layers/sampler.py``, "to avoid -inf"), where vLLM writes
  ``-9999.0`` and llama-server the lowest float too: on a sampled token it is no
  behaviour log-prob, and ``/generate``'s answer carrying it was recorded.
* An answer whose HTTP head breaks HTTP/1.1 (``Transfer-Encoding`` beside
  ``Content-Length``, two ``Content-Length`` values, a status line that is not HTTP)
  is an answer the client cannot read, not a service that is down.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from focus.backends import HttpConfig, OpenAICompatPolicy, SGLangPolicy
from focus.policy import PolicyError, SamplingParams, ServiceUnavailable, UnreadableAnswers

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


def vllm_body(ids: list[int]) -> bytes:
    choice = {
        "index": 0,
        "text": "abc",
        "logprobs": {"token_logprobs": [-0.5] * len(ids), "tokens": [f"token_id:{t}" for t in ids]},
        "finish_reason": "length",
        "token_ids": ids,
    }
    return json.dumps({"id": "cmpl-0", "object": "text_completion", "model": "m", "choices": [choice]}).encode()


#: Heads aiohttp's parser refuses (llhttp), each with the words of its refusal.
HEADS = {
    "transfer-encoding beside content-length": (
        lambda n: (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" % n
        ),
        "Transfer-Encoding can't be present with Content-Length",
    ),
    "two content-lengths": (
        lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n" % (n, n + 1),
        "Duplicate Content-Length",
    ),
    "no http status line": (lambda n: b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "Bad status line"),
}


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_an_answer_whose_http_head_cannot_be_parsed_is_named_at_once_not_waited_for_as_an_outage(kind):
    """Every answer's head breaks HTTP/1.1. It was a connection failure, so the client
    waited for the service as down (``outage_wait_s``, here 20 s; 300 s by default) and
    then gave up as an outage with the cause last; now the answers are unreadable,
    named within the first few."""
    head, words = HEADS[kind]
    body = vllm_body([65, 66, 67])

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in request_head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                writer.write(head(len(body)) + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def go() -> tuple[BaseException, float]:
        listener = await asyncio.start_server(answer, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        policy = OpenAICompatPolicy(url, "m", config=FAST.model_copy(update={"outage_wait_s": 20.0}))
        t0 = time.monotonic()
        try:
            await policy.sample([1, 2, 3], PARAMS)
        except PolicyError as e:
            return e, time.monotonic() - t0
        finally:
            await policy.aclose()
            listener.close()
            await listener.wait_closed()
        raise AssertionError("an answer with an unreadable head was read")

    error, took = asyncio.run(go())
    # the error's type says which path ended the call, not wall time (a loaded machine is
    # slow): before, a ServiceUnavailable after the outage wait (20 s here)
    assert not isinstance(error, ServiceUnavailable), f"{took:.1f} s: {error}"
    assert isinstance(error, UnreadableAnswers), (took, error)
    assert str(error).startswith("the model service's answers cannot be read: the answer's HTTP head cannot be parsed")
    assert words in str(error), error


def vllm_answer(ids: list[int], logprobs: list[float], finish: str) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": "abc",
        "logprobs": {"token_logprobs": logprobs, "tokens": [f"token_id:{t}" for t in ids]},
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": ids,
    }
    return {"id": "cmpl-0", "object": "text_completion", "model": "m", "choices": [choice]}


@pytest.mark.parametrize("kind", ["sglang", "openai"])
def test_a_burst_of_aborted_samples_is_retried_not_taken_for_unreadable_answers(kind):
    """Every request in flight is ended by the server once (``finish_reason`` abort: an
    SGLang weights update with ``abort_all_requests``, vLLM's pause with abort), then
    answered. Aborted answers counted as answers of one malformed shape: 5 in a row
    before any good answer (16 after) stopped the calls with ``UnreadableAnswers``, which
    stops a collection; now each is sampled again with its seed and recorded exactly."""
    seen: set[str] = set()
    sampled: dict[int, tuple[list[int], list[float]]] = {}

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        sp = body.get("sampling_params", body)
        seed = sp.get("sampling_seed", sp.get("seed"))
        ids, logprobs = [60 + seed % 7, 61, 62], [-0.5, -0.25, -1.0 - seed / 64]
        sampled[seed] = (ids, logprobs)
        first = json.dumps(body, sort_keys=True) not in seen
        seen.add(json.dumps(body, sort_keys=True))
        await asyncio.sleep(0.01)
        if kind == "sglang":
            answer = sglang_answer(ids, logprobs)
            if first:
                answer["meta_info"]["finish_reason"] = {"type": "abort", "message": "Abort in waiting queue"}
            return web.json_response(answer)
        return web.json_response(vllm_answer(ids, logprobs, "abort" if first else "length"))

    async def go() -> tuple[list[Any], dict[str, Any]]:
        async with aiohttp_server(handle) as url:
            policy = SGLangPolicy(url, config=FAST) if kind == "sglang" else OpenAICompatPolicy(url, "m", config=FAST)
            try:
                got = await asyncio.gather(
                    *(policy.sample([1, 2, 3], PARAMS.with_seed(seed)) for seed in range(24)), return_exceptions=True
                )
                return got, policy.stats()
            finally:
                await policy.aclose()

    got, stats = asyncio.run(go())
    errors = [g for g in got if isinstance(g, BaseException)]
    assert not errors, errors[0]
    assert [(list(c.token_ids), list(c.logprobs)) for c in got] == [sampled[seed] for seed in range(24)]
    assert stats["retries"] == {"malformed response": 24} and stats["failed_calls"] == {}, stats


@pytest.mark.parametrize("status", [301, 302, 308])
def test_a_redirect_is_named_with_where_it_points_not_followed_as_a_get(status):
    """An ingress that moved the endpoint (``http://`` to ``https://``, another path)
    answers with a redirect. aiohttp followed it, and resent a POST redirected with 301
    or 302 as a GET without its body: the server refused that with 405, and the line
    named a refused method, no redirect. Now no redirect is followed (one that keeps the
    method cost every call a second request): the call is refused at once with the line
    naming the status and the address, and a wave of such refusals stops the collection
    as a refusal of every request (check the URL)."""
    from focus.agent import Piece, Rollout
    from focus.refusals import RequestsRefused, check_refused

    seen: list[tuple[str, str]] = []

    async def moved(request: web.Request) -> web.Response:
        seen.append((request.method, request.path))
        return web.Response(status=status, headers={"Location": "/v2/completions"})

    async def v2(request: web.Request) -> web.Response:
        seen.append((request.method, request.path))
        if request.method != "POST":
            return web.json_response({"detail": "Method Not Allowed"}, status=405)
        return web.json_response(vllm_answer([65], [-0.5], "length"))

    async def go() -> Any:
        app = web.Application()
        app.router.add_route("POST", "/v1/completions", moved)
        app.router.add_route("*", "/v2/completions", v2)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        policy = OpenAICompatPolicy(f"http://127.0.0.1:{runner.addresses[0][1]}", "m", config=FAST)
        try:
            return await policy.sample([1, 2, 3], PARAMS)
        finally:
            await policy.aclose()
            await runner.cleanup()

    with pytest.raises(PolicyError) as caught:
        asyncio.run(go())
    line = str(caught.value)
    assert f"was rejected with status {status}: it redirects to '/v2/completions'" in line, line
    assert "set the service's URL (model.url, critic.url)" in line
    assert seen == [("POST", "/v1/completions")]  # one request, not retried, nothing sent elsewhere
    failed = Rollout("t", (Piece((), "failed", 0, (1,), cause=f"model: {line}"),))
    with pytest.raises(RequestsRefused, match=rf"refused every request .*status {status}"):
        check_refused([failed] * 3)


@pytest.mark.parametrize("limit", ["server", "agent"])
def test_tasks_whose_opening_prompt_is_over_the_context_stop_the_collection_with_one_line_naming_them(limit):
    """A 400 "maximum context length" to a task's opening prompt (or the agent's own
    ``max_prompt_tokens``) is that task's for good: no rerun can sample it. Every request
    refused so, the search started those roots again until its budget was spent and the
    collection finished with an empty batch under a spent id; now the wave that finds
    every task refused so stops it with one line naming each task, its prompt's length
    and the limit (a task among good ones is left out instead: test_context_limit.py)."""
    from focus.agent import Agent
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.estimation import DirectBranchTd
    from focus.execution import Execution
    from focus.format import ByteCodec
    from focus.priority import Phase, Selective
    from focus.refusals import RequestsRefused
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    refused: list[int] = []

    async def handle(request: web.Request) -> web.Response:
        n = len((await request.json())["prompt"])
        refused.append(n)
        message = (  # vLLM's wording (serving's _validate_input)
            f"This model's maximum context length is 16 tokens. However, your request has {n} input tokens. "
            "Please reduce the length of the input messages."
        )
        return web.json_response({"error": {"message": message, "type": "BadRequestError", "code": 400}}, status=400)

    async def go() -> Any:
        async with aiohttp_server(handle) as url:
            policy = OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size, config=FAST)
            agent = Agent(
                policy,
                ReachTarget(),
                toy_format(),
                max_steps=4,
                sampling=SamplingParams(max_tokens=4),
                max_prompt_tokens=16 if limit == "agent" else None,
            )
            phases = [Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=40, wave_size=4)]
            col = Collector(
                agent,
                search=Selective(phases=phases),
                critic=ConstantCritic(0.5),
                estimator=DirectBranchTd(),
                execution=Execution(max_concurrency=4),
                collection_id="too-long",
                seed=1,
            )
            try:
                return col.prepare(await col.search(reach_target_tasks(2, seed=2)))
            finally:
                await policy.aclose()

    with pytest.raises(RequestsRefused) as caught:
        asyncio.run(go())
    line = str(caught.value)
    assert line.startswith("every task's opening prompt (2 of 2) was refused as over the model's context"), line
    assert (
        "task 'reach-2-0' (21 prompt tokens; the limit is 16), task 'reach-2-1' (21 prompt tokens; the limit is 16)"
        in line
    ), line
    assert "\n" not in line and len(refused) == (4 if limit == "server" else 0)


def _restart_answers(request_body: dict[str, Any]) -> dict[str, Any]:
    """What a server shutting down for a restart (or an SGLang weights update with
    ``abort_all_requests``) answers every request in flight: a sample it ended itself."""
    if "input_ids" in request_body:
        meta = {"id": "x", "finish_reason": {"type": "abort", "message": "Abort all requests"}, "prompt_tokens": 1}
        meta.update(completion_tokens=1, cached_tokens=0, output_token_logprobs=[[-0.1, 65, None]])
        return {"text": "", "output_ids": [65], "meta_info": meta}
    choice = {"index": 0, "text": "A", "finish_reason": "abort", "token_ids": [65]}
    choice["logprobs"] = {"token_logprobs": [-0.1], "tokens": ["token_id:65"]}
    return {"id": "c", "object": "text_completion", "model": "focus-tinylm", "choices": [choice]}


@pytest.mark.parametrize("backend", ["openai", "sglang"])
def test_a_restart_that_aborts_every_request_in_flight_then_502s_leaves_the_batch_unchanged(
    local_model_server, backend
):
    """The embedded model behind a proxy that, from its 8th request, answers 30
    requests as aborted (a shutdown ending what is in flight), then 502 until 1.5 s have
    passed (the server gone, the proxy up), then passes the requests on again: the collection
    waits it out and its batch is the uninterrupted run's, bit for bit. The abort burst
    stopped it as unreadable answers (16 in a row)."""
    import aiohttp

    from focus.agent import Agent
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.estimation import DirectBranchTd
    from focus.execution import Execution
    from focus.format import ByteCodec
    from focus.priority import Phase, Selective
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    upstream: str = local_model_server.url  # type: ignore[attr-defined]
    seen = {"requests": 0, "aborted": 0, "502": 0}
    began: list[float] = []

    async def collect(url: str) -> list[tuple[Any, ...]]:
        config = HttpConfig(outage_wait_s=10, backoff_s=0.01, backoff_max_s=0.1, timeout_s=30)
        kind = OpenAICompatPolicy if backend == "openai" else SGLangPolicy
        policy = kind(url, vocab_size=ByteCodec.vocab_size, config=config)
        agent = Agent(policy, ReachTarget(), toy_format(), max_steps=6, sampling=SamplingParams(max_tokens=8))
        phases = [Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=24, wave_size=6)]
        col = Collector(
            agent,
            search=Selective(phases=phases),
            critic=ConstantCritic(0.5),
            estimator=DirectBranchTd(),
            execution=Execution(max_concurrency=6),
            collection_id="restart",
            seed=3,
        )
        try:
            batch = col.prepare(await col.search(reach_target_tasks(3, seed=2)))
        finally:
            await policy.aclose()
        assert batch.stats["failed_rollouts"] == 0
        return [(r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, r.logprobs) for r in batch.actor]

    async def go() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        session = aiohttp.ClientSession()

        async def forward(request: web.Request) -> web.Response:
            body = await request.read()
            seen["requests"] += 1
            if seen["requests"] == 8:
                began.append(time.monotonic())
            since = time.monotonic() - began[0] if began else None
            if request.method == "POST" and since is not None and seen["aborted"] < 30:
                seen["aborted"] += 1
                return web.json_response(_restart_answers(json.loads(body)))
            if request.method == "POST" and since is not None and since < 1.5:
                seen["502"] += 1
                return web.Response(status=502, text="Bad Gateway")
            async with session.request(request.method, upstream + request.path_qs, data=body) as resp:
                return web.Response(body=await resp.read(), status=resp.status, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            clean = await collect(upstream)
            restarted = await collect(f"http://127.0.0.1:{runner.addresses[0][1]}")
        finally:
            await session.close()
            await runner.cleanup()
        return clean, restarted

    clean, restarted = asyncio.run(go())
    assert seen["aborted"] == 30 and seen["502"] > 0, seen  # past the 16 in a row the unreadable rule stopped at
    assert clean and restarted == clean
