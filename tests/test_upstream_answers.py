"""The clients against answers shaped as the newest vLLM, SGLang and llama-server
releases write them, sent as those servers' HTTP layers may send them.

Read from the sources (the public repositories as indexed in December 2026):

* vLLM (``vllm/entrypoints/openai/completion/protocol.py``, ``completion/serving.py``,
  ``fingerprint.py``): ``CompletionResponse`` now also carries ``ec_transfer_params``
  and ``metrics``, each choice ``routed_experts``, and ``system_fingerprint`` is
  ``vllm-<version>-<hash8>`` by default (``--fingerprint-mode full``). A choice's
  ``index`` is ``len(choices)`` in the order of the request's outputs, which
  ``v1/engine/parallel_sampling.py`` keeps by sample index; a proxy or gateway that
  merges choices need not.
* SGLang (``python/sglang/srt/managers/tokenizer_manager.py``):
  ``meta_info`` adds ``reasoning_tokens``, ``cached_tokens_details`` and timing fields;
  some releases wrote ``output_ids`` only for a server started with
  ``--return-token-ids`` (``{"text", "meta_info"}`` otherwise).
* llama-server (``tools/server/server-task.cpp``, ``to_json_non_oaicompat``): ``tokens``
  always, ``timings`` with ``draft_n`` and ``draft_n_accepted`` under speculative
  decoding.

Every body goes out with ``Transfer-Encoding: chunked`` in small pieces, no
``Content-Length``: what a server that streams its JSON (or a proxy that re-chunks it)
sends although no stream was asked for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web
from test_other_servers import llamacpp_routes
from test_real_wire_formats import (
    EOT,
    FAST,
    FORMAT,
    Server,
    Vllm,
    check_exact,
    draw,
    make_agent,
    rollout,
    serve,
    serving,
    sglang_routes,
    vllm_routes,
)

from focus.backends import LlamaCppPolicy, OpenAICompatPolicy, SGLangPolicy
from focus.env import Task
from focus.policy import SamplingParams, UnreadableAnswers

pytestmark = [pytest.mark.timeout(60), pytest.mark.integration]  # loopback servers; fast, not slow

Answer = Callable[[dict[str, Any]], dict[str, Any]]


@asynccontextmanager
async def serve_chunked(routes: dict[tuple[str, str], Any], newest: Answer) -> AsyncIterator[Server]:
    """:func:`test_real_wire_formats.serve` whose answers to POSTs are rewritten by
    ``newest`` and sent chunked, 7 bytes a chunk."""
    server = Server()

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else {}
        server.bodies.append((request.path, body))
        status, answer = routes[(request.method, request.path)](server, body)
        if status == 200 and request.method == "POST":
            answer = newest(answer)
        data = json.dumps(answer).encode()
        response = web.StreamResponse(status=status, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for i in range(0, len(data), 7):
            await response.write(data[i : i + 7])
        await response.write_eof()
        return response

    async with serving(server, routes, handle):
        yield server


def newest_vllm(answer: dict[str, Any]) -> dict[str, Any]:
    for choice in answer["choices"]:
        choice["routed_experts"] = None
    return {**answer, "system_fingerprint": "vllm-0.13.0-1f0e2d3c", "ec_transfer_params": None, "metrics": None}


def newest_sglang(answer: dict[str, Any]) -> dict[str, Any]:
    meta = {**answer["meta_info"], "reasoning_tokens": 0, "queue_time": 0.001, "prefill_launch_delay": 0.0}
    meta["cached_tokens_details"] = {"device": 0, "host": 0}
    return {"text": answer["text"], "meta_info": meta}  # no output_ids: a server without --return-token-ids


def newest_llamacpp(answer: dict[str, Any]) -> dict[str, Any]:
    return {**answer, "timings": {**answer["timings"], "draft_n": 4, "draft_n_accepted": 3}}


CASES = {
    "vllm": (
        lambda: vllm_routes(Vllm()),
        newest_vllm,
        lambda url: OpenAICompatPolicy(url, "Qwen/Qwen3-4B", config=FAST),
    ),
    "sglang": (sglang_routes, newest_sglang, lambda url: SGLangPolicy(url, config=FAST)),
    "llama-server": (llamacpp_routes, newest_llamacpp, lambda url: LlamaCppPolicy(url, config=FAST)),
}
#: Where each sends its prompts, and the field of the request that holds them.
PROMPTS = {
    "vllm": ("/v1/completions", "prompt"),
    "sglang": ("/generate", "input_ids"),
    "llama-server": ("/completion", "prompt"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_newest_answers_sent_in_chunks_are_recorded_token_exactly(name):
    """Fields the clients do not read ride along; a body in chunks reads as one."""
    routes, newest, make = CASES[name]

    async def go() -> None:
        async with serve_chunked(routes(), newest) as server:
            ro = await rollout(make(server.url))
            check_exact(ro, server, server.prompts(*PROMPTS[name]))

    asyncio.run(go())


def test_n_samples_whose_choices_come_in_another_order_go_to_their_own_seeds():
    """Sample ``i`` of a request with ``n`` and a seed is the choice whose ``index`` is
    ``i`` (drawn with ``seed + i``), wherever it stands in the list: a gateway that
    merges choices as they finish writes them in that order."""

    def reorder(answer: dict[str, Any]) -> dict[str, Any]:
        return {**answer, "choices": answer["choices"][::-1]}

    async def go() -> None:
        async with serve_chunked(vllm_routes(Vllm()), reorder) as server:
            config = FAST.model_copy(update={"group_siblings": True})
            policy = OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=config)
            policy.vocab_size = FORMAT.codec.vocab_size
            prompt = FORMAT.codec.render([])
            try:
                for _ in range(2):
                    got = await policy.sample_siblings(
                        prompt, SamplingParams(max_tokens=3, seed=40), [("a",), ("b",), ("c",)]
                    )
                    want = [draw(prompt, 40 + i, 3) for i in range(3)]
                    assert [(list(c.token_ids), list(c.logprobs)) for c in got] == [(w[0], w[1]) for w in want]
            finally:
                await policy.aclose()
            assert sorted(b.get("n") for p, b in server.bodies if p == "/v1/completions") == [1, 3, 3]  # grouped

    asyncio.run(go())


# ---- what vLLM does to a request that the answer does not say ----


async def rollout_at(policy: Any, temperature: float) -> Any:
    agent = make_agent(policy, temperature)
    try:
        root = await agent.start(Task("reach-9", {"target": 9}))
        return await agent.rollout(root, seed=11)
    finally:
        await policy.aclose()


def test_a_temperature_vllm_would_raise_to_0_01_stops_before_any_request():
    """vLLM raises a temperature in (0, 0.01) to 0.01 (``SamplingParams.__post_init__``,
    ``_MAX_TEMP``) and says so only in its own log: a collection at 0.005 recorded
    samples and log-probs of temperature 0.01 as those of 0.005, which the trainer then
    recomputes at 0.005. It stops now, before any completion is asked for, in one line."""

    async def go() -> None:
        async with serve(vllm_routes(Vllm())) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout_at(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST), 0.005)
            assert server.prompts("/v1/completions", "prompt") == []  # nothing sampled at the wrong temperature
        line = str(e.value)
        assert "\n" not in line and "raises a temperature in (0, 0.01) to 0.01" in line and "0.005" in line, line

    asyncio.run(go())


def test_behind_a_proxy_the_answer_names_vllm_and_the_low_temperature_stops_at_the_first_answer():
    """A gateway's ``/v1/models`` names itself (LiteLLM: ``owned_by`` ``openai``); vLLM's
    answer names vLLM in its ``system_fingerprint`` (``vllm-<version>-<hash8>``)."""
    routes = vllm_routes(Vllm())
    models = routes[("GET", "/v1/models")]

    def gateway_models(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        status, data = models(server, body)
        return status, {**data, "data": [{**c, "owned_by": "openai"} for c in data["data"]]}

    routes[("GET", "/v1/models")] = gateway_models

    async def go() -> None:
        async with serve_chunked(routes, newest_vllm) as server:
            with pytest.raises(UnreadableAnswers, match=r"is vLLM, which raises a temperature"):
                await rollout_at(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST), 0.005)
            assert len(server.prompts("/v1/completions", "prompt")) == 1

    asyncio.run(go())


@pytest.mark.parametrize("temperature", [0.0, 0.01, 0.5])
def test_vllm_samples_at_0_at_0_01_and_above_as_asked(temperature):
    """Greedy (0) and every temperature from 0.01 on are vLLM's own: recorded as before,
    and ``/v1/models`` is not asked (nothing to check)."""

    async def go() -> None:
        async with serve_chunked(vllm_routes(Vllm()), newest_vllm) as server:
            ro = await rollout_at(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST), temperature)
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))
            assert {u["temperature"] for u in server.used} == {temperature}
            # no question for the temperature; one, after the first answer, for the weights' root
            assert [p for p, _ in server.bodies].count("/v1/models") == 1 and server.bodies[0][0] != "/v1/models"

    asyncio.run(go())


def test_another_server_samples_at_a_temperature_below_0_01():
    """The embedded server and SGLang sample at the temperature asked, however low: a
    server that is not vLLM (its cards not ``owned_by`` it, no vLLM fingerprint) is
    asked once and then sampled from."""
    routes = vllm_routes(Vllm())
    models = routes[("GET", "/v1/models")]

    def other_models(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        status, data = models(server, body)
        return status, {**data, "data": [{**c, "owned_by": "focus"} for c in data["data"]]}

    def honest(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        status, answer = complete(server, body)
        server.used[-1]["temperature"] = body["temperature"]  # this server samples at the temperature asked
        return status, answer

    complete = routes[("POST", "/v1/completions")]
    routes.update({("GET", "/v1/models"): other_models, ("POST", "/v1/completions"): honest})

    async def go() -> None:
        async with serve(routes) as server:
            ro = await rollout_at(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST), 0.005)
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))
            # asked once for the temperature, once for the weights' root (test_weights_restart.py)
            assert [p for p, _ in server.bodies].count("/v1/models") == 2

    asyncio.run(go())


# ---- stops that FOCUS did not ask for ----

#: An end-of-generation id of the model's own (``generation_config.json``'s ``eos_token_id``
#: beside the tokenizer's: Qwen3's ``<|endoftext|>`` beside ``<|im_end|>``), which vLLM adds
#: to the request's ``stop_token_ids`` (``SamplingParams.update_from_generation_config``).
MODEL_EOS = 262


def model_stop_routes() -> dict[tuple[str, str], Any]:
    """vLLM whose sample ends in the model's own stop id where the stand-in drew the end of
    turn: ``finish_reason`` ``stop``, ``stop_reason`` that id (``check_stop``), the id kept
    in ``token_ids`` and its log-prob in ``token_logprobs``."""
    routes = vllm_routes(Vllm())
    complete = routes[("POST", "/v1/completions")]

    def answer(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        assert MODEL_EOS not in body.get("stop_token_ids", ())  # the server's addition, not FOCUS's
        status, data = complete(server, body)
        for i, choice in enumerate(data["choices"]):
            ids, lps = server.sampled[i - len(data["choices"])]
            if choice["finish_reason"] == "stop":
                ids[-1] = MODEL_EOS
                choice.update(token_ids=ids, stop_reason=MODEL_EOS)
                choice["logprobs"]["tokens"][-1] = f"token_id:{MODEL_EOS}"
        return status, data

    routes[("POST", "/v1/completions")] = answer
    return routes


def test_a_stop_id_the_model_adds_ends_a_turn_recorded_exactly_as_stopped():
    """The turn holds the model's stop id and its log-prob as sampled, is recorded as
    ``stop``, and the next prompt continues it exactly (the codec closes the turn after it)."""

    async def go() -> None:
        async with serve_chunked(model_stop_routes(), newest_vllm) as server:
            ro = await rollout(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST))
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))
            ended = [t for t in ro.turns if t.completion_ids[-1] == MODEL_EOS]
            assert ended and all(t.finish_reason == "stop" for t in ended)
            assert all(t.finish_reason == "length" for t in ro.turns if t.completion_ids[-1] != MODEL_EOS)

    asyncio.run(go())


def test_a_stop_id_sampled_as_the_last_allowed_token_is_recorded_as_stop():
    """vLLM releases whose ``check_stop`` tested the length cap before the stop ids (older
    releases of its V1 engine) answer ``length`` for a sample whose last allowed token is one of
    the request's stop ids: the turn is complete, but was recorded ``length`` and exported
    as truncated (slime's ``TRUNCATED``)."""
    routes = vllm_routes(Vllm())
    complete = routes[("POST", "/v1/completions")]

    def length_first(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        status, data = complete(server, body)
        for choice in data["choices"]:
            if len(choice["token_ids"]) >= body["max_tokens"]:
                choice.update(finish_reason="length", stop_reason=None)
        return status, data

    routes[("POST", "/v1/completions")] = length_first

    async def go() -> None:
        async with serve(routes) as server:
            ro = await rollout(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST), seed=3)
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))
            full = [t for t in ro.turns if len(t.completion_ids) == 3 and t.completion_ids[-1] == EOT]
            assert full, "no sample ended in its stop id at max_tokens: pick another seed"
            assert [t.finish_reason for t in ro.turns] == [
                "stop" if t.completion_ids[-1] == EOT else "length" for t in ro.turns
            ]

    asyncio.run(go())


# ---- SGLang without --enable-deterministic-inference ----


def server_info(deterministic: bool | None) -> dict[str, Any]:
    """SGLang's ``/server_info``: ``dataclasses.asdict(server_args)`` and more (a release
    before its deterministic-inference work has no such field)."""
    info: dict[str, Any] = {"model_path": "Qwen/Qwen3-4B", "attention_backend": "fa3", "version": "0.5.6"}
    if deterministic is not None:
        info["enable_deterministic_inference"] = deterministic
    return info


@asynccontextmanager
async def slow_sglang(deterministic: bool | None, path: str = "/server_info") -> AsyncIterator[Server]:
    """SGLang's ``/generate`` answering after 0.15 s; without deterministic inference it
    ignores ``sampling_seed`` (``SamplingBatchInfo`` builds no seed tensor) and draws anew."""
    routes = sglang_routes()
    draws = iter(range(10**6))
    server = Server()

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            server.bodies.append((request.path, {}))
            if request.path != path or deterministic is None and path == "/server_info":
                return web.json_response({"detail": "Not Found"}, status=404)
            return web.json_response(server_info(deterministic))
        body = await request.json()
        server.bodies.append((request.path, body))
        if not deterministic:  # the seed sent plays no part
            seeded = body["sampling_params"] if request.path == "/generate" else body
            seeded["sampling_seed" if request.path == "/generate" else "seed"] = 1000 + next(draws)
        await asyncio.sleep(0.15)
        status, answer = routes[("POST", request.path)](server, body)
        return web.json_response(answer, status=status)

    async with serving(server, {**routes, ("GET", path): None}, handle):
        yield server


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
def test_an_sglang_that_ignores_sampling_seed_is_named_once_and_not_hedged(path, caplog):
    """SGLang without ``--enable-deterministic-inference`` accepts ``sampling_seed`` and
    samples unseeded. FOCUS hedged its seeded requests as if both copies sampled the same
    tokens: two samples, the faster one kept (short completions favoured). Now one
    warning line names the flag, and its requests are not hedged."""

    async def go() -> dict[str, Any]:
        async with slow_sglang(False, path) as server:
            policy = SGLangPolicy(server.url, config=FAST.model_copy(update={"hedge_after_s": 0.02}))
            try:
                for seed in (1, 2, 3):
                    await policy.sample(FORMAT.codec.render([]), SamplingParams(max_tokens=3, seed=seed))
                stats = policy.stats()
            finally:
                await policy.aclose()
            assert [p for p, _ in server.bodies].count("/generate") == 3  # one request a call, no copies
            return stats

    with caplog.at_level("WARNING"):
        stats = asyncio.run(go())
    assert stats["hedges"] == 0, stats
    lines = [r.getMessage() for r in caplog.records if "deterministic" in r.getMessage()]
    assert len(lines) == 1 and "--enable-deterministic-inference" in lines[0] and "\n" not in lines[0], lines


def test_sglang_s_completions_behind_the_openai_kind_are_checked_the_same_way(caplog):
    """SGLang's ``/v1/completions`` (``model.kind = openai``; its answers carry
    ``metadata.weight_version``) takes ``seed`` as ``sampling_seed`` and ignores it the same
    way: after its first answer the client asks, warns once, and hedges no more. A vLLM
    answer (no such ``metadata``) asks nothing."""

    async def go() -> None:
        async with slow_sglang(False) as server:
            policy = OpenAICompatPolicy(server.url, "default", config=FAST.model_copy(update={"hedge_after_s": 0.02}))
            try:
                await policy.sample(FORMAT.codec.render([]), SamplingParams(max_tokens=3, seed=1))
                before = policy.stats()["hedges"]
                for seed in (2, 3, 4):
                    await policy.sample(FORMAT.codec.render([]), SamplingParams(max_tokens=3, seed=seed))
                after = policy.stats()["hedges"]
            finally:
                await policy.aclose()
            assert before >= 1 and after == before, (before, after)  # the first answer told; none since
            assert [p for p, _ in server.bodies].count("/server_info") == 1

    with caplog.at_level("WARNING"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if "deterministic" in r.getMessage()]
    assert len(lines) == 1 and "--enable-deterministic-inference" in lines[0], lines


@pytest.mark.parametrize("deterministic", [True, None])
def test_an_sglang_with_deterministic_inference_or_that_does_not_say_is_hedged_as_before(deterministic, caplog):
    async def go() -> dict[str, Any]:
        async with slow_sglang(deterministic) as server:
            policy = SGLangPolicy(server.url, config=FAST.model_copy(update={"hedge_after_s": 0.02}))
            try:
                got = await policy.sample(FORMAT.codec.render([]), SamplingParams(max_tokens=3, seed=5))
                if deterministic:
                    assert list(got.token_ids) == draw(FORMAT.codec.render([]), 5, 3)[0]
                return policy.stats()
            finally:
                await policy.aclose()

    with caplog.at_level("WARNING"):
        stats = asyncio.run(go())
    assert stats["hedges"] >= 1, stats
    assert not [r for r in caplog.records if "deterministic" in r.getMessage()]


# ---- request fields that change what the answer is ----


@pytest.mark.parametrize(
    "extra, why",
    [
        ({"echo": True}, "log-probs would start with the prompt's"),
        ({"stream": True}, "server-sent events"),
        ({"n": 4}, "its own seed"),
        ({"best_of": 3}, "likeliest of several samples"),
        ({"use_beam_search": True}, "does not sample"),
        ({"seed": 7}, "every rollout the same"),
        ({"temperature": 0.5, "top_k": 20}, "another temperature than the one recorded"),
    ],
)
def test_extra_body_may_not_set_what_changes_the_answer_or_the_sample(extra, why):
    """vLLM with ``echo`` answers the prompt's log-probs before the sample's (``token_ids``
    the sample's only), ``stream`` answers server-sent events, ``best_of`` keeps the
    likeliest sample, a fixed ``seed`` gives every call one seed, and ``temperature``
    samples at another temperature than the recorded one: each was merged into every
    request unchecked (the answers then failed as malformed, or were recorded wrong).
    Refused where the client is made, in the configuration too, in one line."""
    from tasks.config import ConfigError, load_config

    with pytest.raises(ValueError, match=f"extra_body sets {next(iter(extra))} .*{why}.*: leave it out"):
        OpenAICompatPolicy("http://127.0.0.1:9", config=FAST, extra_body=extra)
    settings = {"model.kind": "openai", "model.url": "http://127.0.0.1:9", "model.options": {"extra_body": extra}}
    with pytest.raises(ConfigError, match="extra_body sets"):
        load_config(overrides=settings).build_policy()
    OpenAICompatPolicy("http://127.0.0.1:9", config=FAST, extra_body={"top_k": 20, "prompt_logprobs": 1})  # fine


def test_prompt_logprobs_ride_along_and_the_sample_is_recorded_exactly():
    """``prompt_logprobs`` (set through ``extra_body``) adds the prompt's log-probs to each
    choice (``None`` for its first token, then ``{id: {logprob, rank, decoded_token}}``):
    nothing FOCUS reads, and the turn is the sample's."""
    routes = vllm_routes(Vllm())
    complete = routes[("POST", "/v1/completions")]

    def with_prompt_logprobs(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        status, data = complete(server, body)
        assert body["prompt_logprobs"] == 1
        for choice in data["choices"]:
            choice["prompt_logprobs"] = [None] + [
                {str(t): {"logprob": -1.5, "rank": 2, "decoded_token": chr(t % 256)}} for t in body["prompt"][1:]
            ]
        return status, data

    routes[("POST", "/v1/completions")] = with_prompt_logprobs

    async def go() -> None:
        async with serve_chunked(routes, newest_vllm) as server:
            policy = OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST, extra_body={"prompt_logprobs": 1})
            ro = await rollout(policy)
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))

    asyncio.run(go())


# ---- HTTP/1.0 and connections a server closes ----


@asynccontextmanager
async def raw_http(mode: str) -> AsyncIterator[Server]:
    """vLLM's answers written by hand on a bare socket, the way an HTTP/1.0 server or a
    proxy in front of one sends them: ``http10-close`` (HTTP/1.0, no ``Content-Length``,
    the body ends when the server closes), ``http10-keepalive`` (HTTP/1.0 with
    ``Connection: keep-alive`` and ``Content-Length``, the connection kept), ``close``
    (HTTP/1.1 ``Connection: close``), ``silent-close`` (HTTP/1.1 with ``Content-Length``,
    the connection closed after each answer without a word)."""
    server = Server()
    complete = vllm_routes(Vllm())[("POST", "/v1/completions")]

    async def serve_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                body = json.loads(await reader.readexactly(int(headers.get("content-length", 0))) or b"{}")
                path = lines[0].split()[1]
                server.bodies.append((path, body))
                status, answer = complete(server, body) if path == "/v1/completions" else (404, {"detail": "Not Found"})
                data = json.dumps(answer).encode()
                reason = "OK" if status == 200 else "Not Found"
                if mode == "http10-close":
                    writer.write(
                        f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\n\r\n".encode() + data
                    )
                else:
                    version, conn = {
                        "http10-keepalive": ("1.0", "Connection: keep-alive\r\n"),
                        "close": ("1.1", "Connection: close\r\n"),
                        "silent-close": ("1.1", ""),
                    }[mode]
                    writer.write(
                        f"HTTP/{version} {status} {reason}\r\nContent-Type: application/json\r\n{conn}"
                        f"Content-Length: {len(data)}\r\n\r\n".encode()
                        + data
                    )
                await writer.drain()
                if mode != "http10-keepalive":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(serve_conn, "127.0.0.1", 0)
    server.url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        yield server
    finally:
        listener.close()
        await listener.wait_closed()


@pytest.mark.parametrize("mode", ["http10-close", "http10-keepalive", "close", "silent-close"])
def test_http_1_0_and_closed_connections_are_read_whole_without_retries(mode):
    async def go() -> None:
        async with raw_http(mode) as server:
            policy = OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST)
            policy.vocab_size = FORMAT.codec.vocab_size
            try:
                for seed in range(6):
                    got = await policy.sample(FORMAT.codec.render([]), SamplingParams(max_tokens=3, seed=seed))
                    assert (list(got.token_ids), list(got.logprobs)) == server.sampled[-1]
                stats = policy.stats()
            finally:
                await policy.aclose()
            assert stats["retries"] == {} and stats["attempts"] == 6, stats

    asyncio.run(go())
