"""FOCUS's clients against loopback servers that answer as model servers it was never
written for: HuggingFace TGI, llama.cpp's ``llama-server``, Ollama, an OpenAI-compatible
proxy (LiteLLM, OpenRouter) in front of vLLM, and vLLM's chat endpoint given as the URL.

Each stand-in answers field for field as the real server's source does, for the
requests FOCUS sends (read from the sources, never copied):

* TGI (``router/src/lib.rs``, ``server.rs``): ``/v1/completions`` deserialises ``prompt``
  as a string or strings (``Prompt`` / ``PromptDeserializer``; anything else is axum's
  plain-text 422 ``Failed to deserialize the JSON body into the target type: prompt: data
  did not match any variant of untagged enum PromptDeserializer at line 1 column N``) and
  answers ``logprobs: null``; ``/generate`` takes ``inputs`` text (``missing field
  `inputs```) and answers ``details.tokens`` of ``{id, text, logprob, special}``;
  ``/v1/models`` lists ``model_id``.
* llama-server (``tools/server``: README, ``server-context.cpp``, ``server-task.cpp``,
  ``server-common.cpp``): ``/completion`` takes a prompt of ids, ``n_predict``,
  ``n_probs``, ``return_tokens``, ``samplers``, ``seed``; answers ``tokens``,
  ``completion_probabilities`` (``{id, token, bytes, logprob, top_logprobs}``, or ``prob``
  and ``top_probs`` with ``post_sampling_probs``; ``n_probs`` top entries, none and a
  placeholder probability 1 for a token accepted from a speculative draft), ``stop_type``
  ``eos``/``limit``/``word``,
  ``timings.cache_n``. It stops only at the model's end-of-generation tokens, and records
  no log-prob for a token that leaves the text inside a UTF-8 character. Its
  ``/v1/completions`` takes ``logprobs`` as ``n_probs`` (0: none, ``logprobs: null``),
  gives log-probs as ``{"content": [...]}``, no ``token_ids``, and its build as
  ``system_fingerprint``. Releases of 2024 answered ``{"content", "probs": [{"tok_str",
  "prob"}]}`` and no ``tokens``.
* Ollama (``openai/openai.go``, ``middleware/openai.go``, ``api/types.go``):
  ``CompletionRequest.Prompt`` is a Go ``string``; a list is gin's 400
  ``{"error": {"message": "json: cannot unmarshal array into Go struct field
  CompletionRequest.prompt of type string", "type": "invalid_request_error", ...}}``.
* LiteLLM's proxy (``litellm/types/utils.py``): a text completion's choices are rebuilt as
  ``TextChoices(finish_reason, index, text, logprobs)`` (``token_ids`` and
  ``prompt_token_ids`` do not survive); a proxy may also drop the request fields that
  are not OpenAI's, or pass a prompt of ids on as text.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from typing import Any

import pytest
from fixtures.prefect import run_focus
from test_real_wire_formats import (
    DIGITS,
    EOT,
    FAST,
    FORMAT,
    LOGPROBS,
    Server,
    Vllm,
    check_exact,
    draw,
    rollout,
    serve,
    vllm_routes,
)

from focus.backends import LlamaCppPolicy, OpenAICompatPolicy, SGLangPolicy
from focus.backends.http import MalformedResponse
from focus.backends.llamacpp import SAMPLING, parse_completion
from focus.policy import SamplingParams, UnreadableAnswers
from focus.testing import PolicyConformance

pytestmark = [pytest.mark.timeout(60), pytest.mark.integration]  # loopback servers; fast, not slow


def one_line(e: BaseException) -> str:
    line = str(e)
    assert "\n" not in line and "Traceback" not in line, line
    return line


# ---- HuggingFace TGI ----


def axum_422(what: str) -> tuple[int, str]:
    """axum's ``Json`` extractor refusing a body: 422, plain text."""
    return 422, f"Failed to deserialize the JSON body into the target type: {what} at line 1 column 37"


def tgi_routes(model_id: str = "Qwen/Qwen3-4B") -> dict[tuple[str, str], Any]:
    def completions(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        p = body.get("prompt")
        if not (isinstance(p, str) or (isinstance(p, list) and p and all(isinstance(x, str) for x in p))):
            return axum_422("prompt: data did not match any variant of untagged enum PromptDeserializer")
        choice = {"index": 0, "text": "12", "logprobs": None, "finish_reason": "stop"}
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        return 200, {
            "object": "text_completion",
            "id": "",
            "created": 1,
            "model": model_id,
            "system_fingerprint": "3.3.6-native",
            "choices": [choice],
            "usage": usage,
        }

    def generate(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        if not isinstance(body.get("inputs"), str):
            return axum_422("missing field `inputs`")
        tokens = [{"id": 49, "text": "1", "logprob": -0.5, "special": False}]
        details = {"finish_reason": "eos_token", "generated_tokens": 1, "seed": 1, "prefill": [], "tokens": tokens}
        return 200, {"generated_text": "1", "details": details}

    models = {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": model_id}]}
    return {
        ("POST", "/v1/completions"): completions,
        ("POST", "/generate"): generate,
        ("GET", "/v1/models"): lambda s, b: (200, models),
        ("GET", "/health"): lambda s, b: (200, {}),
    }


@pytest.mark.parametrize("kind", ["openai", "sglang"])
def test_tgi_stops_at_its_first_refusal_naming_the_server_and_what_to_run(kind):
    """TGI takes text prompts only. Every request FOCUS sent was refused with a 422,
    each rollout failed as "rejected with status 422" (retried by nothing, run again by
    nothing) and a collection finished with an empty batch; now the first refusal stops
    it with one line that names TGI and the servers to use instead."""

    async def go() -> str:
        async with serve(tgi_routes()) as server:
            policy = (
                OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST)
                if kind == "openai"
                else SGLangPolicy(server.url, config=FAST)
            )
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(policy)
            assert len(server.bodies) == 1  # no retries, no rollout run again
            return one_line(e.value)

    line = asyncio.run(go())
    assert "refused a prompt of token ids (status 422" in line and "HuggingFace TGI" in line, line
    assert "model.kind = openai" in line and "llamacpp" in line, line


# ---- Ollama ----


def go_json_400(struct: str) -> dict[str, Any]:
    """gin's ``ShouldBindJSON`` refusing an array for a Go ``string``, as Ollama's OpenAI
    middleware wraps it."""
    message = f"json: cannot unmarshal array into Go struct field {struct}.prompt of type string"
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}


def ollama_routes() -> dict[tuple[str, str], Any]:
    def completions(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        if not isinstance(body.get("prompt"), str):
            return 400, go_json_400("CompletionRequest")
        return 200, {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "1", "index": 0}]}

    models = {"object": "list", "data": [{"id": "qwen3:4b", "object": "model", "created": 1, "owned_by": "library"}]}
    return {("POST", "/v1/completions"): completions, ("GET", "/v1/models"): lambda s, b: (200, models)}


def test_ollama_stops_at_its_first_refusal_naming_the_server():
    async def go() -> str:
        async with serve(ollama_routes()) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(OpenAICompatPolicy(server.url, "qwen3:4b", config=FAST))
            assert len(server.bodies) == 1
            return one_line(e.value)

    line = asyncio.run(go())
    assert "status 400" in line and "Ollama" in line and "takes text prompts only" in line, line


# ---- llama.cpp's llama-server ----


@dataclass(frozen=True)
class LlamaCpp:
    """One llama-server's behaviour for the fields FOCUS relies on."""

    #: The request's stop id is an end-of-generation token of the GGUF (else it goes on).
    eog: bool = True
    #: The first sampled token is a byte that leaves the text inside a UTF-8 character.
    split_utf8: bool = False
    #: A release of 2024: probs as ``{"content", "probs": [{"tok_str", "prob"}]}``, no ``tokens``.
    old: bool = False
    #: The first sampled token has probability 0 in the log-probs it reports (a logit
    #: bias or grammar applied after them): written as the lowest float32, its
    #: ``logarithm(0)`` (``server-task.cpp``; its JSON library writes ``-inf`` as null).
    zero_prob: bool = False
    #: Speculative decoding (a draft model): every token after the first is accepted
    #: from a draft, and its entry holds a placeholder probability 1 and no top
    #: log-probs (``server-context.cpp``: ``result.prob = 1.0f; // set later``).
    speculative: bool = False


def llamacpp_sample(prompt: list[int], seed: int, n_predict: int, v: LlamaCpp) -> tuple[list[int], list[float], str]:
    """What the server samples: :func:`draw`'s tokens, and past a stop id that is no
    end-of-generation token more digits up to ``n_predict``."""
    ids, lps, stopped = draw(prompt, seed, n_predict)
    if v.split_utf8:  # 'é' as two byte tokens: the first ends inside the character
        ids, lps = ([0xC3, 0xA9] + ids)[:n_predict], ([-0.25, -0.125] + lps)[:n_predict]
        stopped = ids[-1] == EOT
    if stopped and v.eog:
        return ids, lps, "eos"
    rng = random.Random(f"on:{seed}:{prompt}")
    more = n_predict - len(ids)
    return ids + [rng.choice(DIGITS) for _ in range(more)], lps + [rng.choice(LOGPROBS) for _ in range(more)], "limit"


def llamacpp_routes(v: LlamaCpp = LlamaCpp()) -> dict[tuple[str, str], Any]:
    def entry(t: int, lp: float, post: bool, drafted: bool = False) -> dict[str, Any]:
        text = "" if t > 255 else chr(t)
        if post:  # n_probs 1: the most probable token after the sampler chain
            top = [] if drafted else [{"id": t, "token": text, "bytes": [t % 256], "prob": math.exp(lp)}]
            return {
                "id": t,
                "token": text,
                "bytes": [t % 256],
                "prob": 1.0 if drafted else math.exp(lp),
                "top_probs": top,
            }
        # n_probs 1: the most probable token, another than the one sampled
        top = [] if drafted else [{"id": 7, "token": "\x07", "bytes": [7], "logprob": -0.01}]
        return {"id": t, "token": text, "bytes": [t % 256], "logprob": 0.0 if drafted else lp, "top_logprobs": top}

    def completion(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        if "prompt" not in body:  # llama-server's answer to a request without one (focus's first-contact probe)
            return 400, {
                "error": {"code": 400, "message": '"prompt" must be provided', "type": "invalid_request_error"}
            }
        prompt = body["prompt"]
        assert isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        server.used.append({k: body.get(k) for k in ("temperature", "top_p", *SAMPLING)})
        ids, lps, stop_type = llamacpp_sample(prompt, body.get("seed", 0), body["n_predict"], v)
        cut = ids.index(EOT) + 1 if EOT in ids else len(ids)
        server.sampled.append((ids[:cut], lps[:cut]))  # what FOCUS must record
        post = bool(body.get("post_sampling_probs"))
        if v.zero_prob:
            lps = [-3.4028234663852886e38, *lps[1:]]
        kept = [(t, lp) for i, (t, lp) in enumerate(zip(ids, lps, strict=True)) if not (v.split_utf8 and i == 0)]
        answer: dict[str, Any] = {
            "index": 0,
            "content": "".join(chr(t) for t in ids if t < 128),
            "tokens": ids if body.get("return_tokens") else [],
            "id_slot": 0,
            "stop": True,
            "model": "qwen3-4b-q8_0.gguf",
            "tokens_predicted": len(ids),
            "tokens_evaluated": len(prompt),
            "generation_settings": {"n_predict": body["n_predict"], "seed": body.get("seed", 4294967295)},
            "prompt": "<|bos|>...",
            "has_new_line": False,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": "",
            "tokens_cached": len(prompt) + len(ids) - 1,
            "timings": {"cache_n": 0, "prompt_n": len(prompt), "predicted_n": len(ids)},
        }
        if body.get("n_probs", 0) > 0:
            answer["completion_probabilities"] = [
                entry(t, lp, post, drafted=v.speculative and i > 0) for i, (t, lp) in enumerate(kept)
            ]
        if v.old:
            del answer["tokens"]
            answer["completion_probabilities"] = [
                {"content": chr(t % 128), "probs": [{"tok_str": chr(t % 128), "prob": math.exp(lp)}]} for t, lp in kept
            ]
        return 200, answer

    def oai_completions(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        n_probs = body.get("n_probs", body.get("logprobs") or 0)
        ids, lps, stop_type = llamacpp_sample(body["prompt"], body.get("seed", 0), body["max_tokens"], v)
        logprobs = {"content": [entry(t, lp, False) for t, lp in zip(ids, lps, strict=True)]} if n_probs else None
        choice = {"text": "".join(chr(t) for t in ids if t < 128), "index": 0, "logprobs": logprobs}
        choice["finish_reason"] = "stop" if stop_type == "eos" else "length"
        return 200, {
            "choices": [choice],
            "created": 1,
            "model": "qwen3-4b-q8_0.gguf",
            "system_fingerprint": "b6710-74b8fc17",
            "object": "text_completion",
            "usage": {"completion_tokens": len(ids), "prompt_tokens": len(body["prompt"]), "total_tokens": 0},
            "id": "chatcmpl-x",
        }

    card = {"id": "qwen3-4b-q8_0.gguf", "object": "model", "created": 1, "owned_by": "llamacpp", "meta": {}}
    return {
        ("POST", "/completion"): completion,
        ("POST", "/v1/completions"): oai_completions,
        ("GET", "/v1/models"): lambda s, b: (200, {"object": "list", "data": [card]}),
        ("GET", "/props"): lambda s, b: (200, {"model_path": "/models/qwen3-4b-q8_0.gguf", "total_slots": 4}),
        ("GET", "/health"): lambda s, b: (200, {"status": "ok"}),
    }


@pytest.mark.parametrize("v", [LlamaCpp(), LlamaCpp(eog=False)], ids=["stop id is end-of-generation", "it is not"])
def test_a_rollout_against_llama_server_records_the_sampled_ids_and_logprobs(v):
    """``model.kind = llamacpp``: prompts go as ids, the turns hold the ids and log-probs
    the server sampled. A server that does not stop at the request's stop id (no
    ``stop_token_ids`` in llama-server; the id is no end-of-generation token of its GGUF)
    samples on: the answer is cut after the stop id, the tokens before it unchanged."""

    async def go() -> None:
        async with serve(llamacpp_routes(v)) as server:
            policy = LlamaCppPolicy(server.url, config=FAST)
            ro = await rollout(policy)
            check_exact(ro, server, server.prompts("/completion", "prompt"))
            body = server.bodies[0][1]
            assert body["n_probs"] == 1 and body["return_tokens"] is True and body["seed"] == 11
            assert body["n_predict"] == 3 and "stop" not in body
            off = {**{k: SAMPLING[k] for k in SAMPLING}, "temperature": 1.0, "top_p": 1.0}
            assert server.used and all(u == off for u in server.used)
            # no weights version in its answers: the batch records the policy's (model.policy_version)
            assert {t.policy_version for t in ro.turns} == {None} and policy.policy_version == "llamacpp"
            assert [t.finish_reason for t in ro.turns if EOT in t.completion_ids] == [
                "stop" for t in ro.turns if EOT in t.completion_ids
            ]

    asyncio.run(go())


def test_llama_server_answers_that_cannot_be_recorded_token_exactly_stop_in_one_line():
    """A token that ends inside a UTF-8 character has no log-prob entry: the answer is
    malformed (never matched up by guesswork), and one that every request gets stops the
    collection naming the cause; a 2024 release (token texts, no ``tokens``) says to
    upgrade; stop strings are refused before any request."""

    async def go() -> list[str]:
        lines = []
        for v in (LlamaCpp(split_utf8=True), LlamaCpp(old=True)):
            async with serve(llamacpp_routes(v)) as server:
                with pytest.raises(UnreadableAnswers) as e:
                    await rollout(LlamaCppPolicy(server.url, config=FAST))
                lines.append(one_line(e.value))
        async with serve(llamacpp_routes()) as server:
            policy = LlamaCppPolicy(server.url, config=FAST)
            with pytest.raises(UnreadableAnswers) as e:
                try:
                    await policy.sample([1, 2], SamplingParams(max_tokens=2, stop=("\n",), seed=1))
                finally:
                    await policy.aclose()
            assert server.bodies == []
            lines.append(one_line(e.value))
        return lines

    utf8, old, stop = asyncio.run(go())
    assert "no log-prob for token 0 (id 195)" in utf8 and "inside a UTF-8 character" in utf8, utf8
    assert "llama-server of 2025 or later" in old, old
    assert "stop strings ['\\n']" in stop and "stop_token_ids" in stop, stop


def test_llama_servers_stand_in_for_minus_infinity_on_a_sampled_token_is_never_recorded():
    """llama-server writes the log of a probability of 0 as the lowest float32 (-3.4e38),
    as vLLM writes -9999.0. On a sampled token it was recorded as the turn's behaviour
    log-prob, where a trainer's ratio exp(new - old) overflows; now the answer is
    malformed, as vLLM's is, and a server that answers every request so stops the
    collection with one line that names the value."""

    async def go() -> str:
        async with serve(llamacpp_routes(LlamaCpp(zero_prob=True))) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(LlamaCppPolicy(server.url, config=FAST))
            assert server.bodies  # it asked, and recorded nothing
        return str(e.value)

    line = asyncio.run(go())
    assert "\n" not in line and "-3.4028234663852886e+38 of sampled token 0" in line, line
    assert "llama-server's stand-in for -inf" in line, line


@pytest.mark.parametrize("post", [False, True], ids=["logprob", "post_sampling_probs"])
def test_llama_server_with_speculative_decoding_stops_in_one_line_not_recording_placeholders(post):
    """llama-server gives the tokens it accepts from a speculative draft probability 1
    without computing it (no top log-probs, where ``n_probs: 1`` lists one): they were
    recorded with behaviour log-prob 0.0, a silent wrong log-prob for most tokens of an
    answer. Now such an answer is malformed, and a server that answers every request
    so stops the collection with one line that says to turn drafting off."""

    async def go() -> str:
        async with serve(llamacpp_routes(LlamaCpp(speculative=True))) as server:
            extra = {"post_sampling_probs": True} if post else None
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(LlamaCppPolicy(server.url, config=FAST, extra_body=extra))
        return str(e.value)

    line = asyncio.run(go())
    assert "\n" not in line and "log-prob entry 1 (id " in line and "is a placeholder" in line, line
    assert "speculative draft" in line and "without speculative decoding" in line, line


def test_llama_server_answer_shapes_as_parsed():
    lp = {"id": 49, "token": "1", "bytes": [49], "logprob": -0.5, "top_logprobs": [{"id": 49, "logprob": -0.5}]}
    answer = {"tokens": [49, 50], "completion_probabilities": [lp, {**lp, "id": 50}], "stop_type": "limit"}
    got = parse_completion(answer)
    assert (got.token_ids, got.logprobs, got.finish_reason) == ((49, 50), (-0.5, -0.5), "length")
    post = {**answer, "completion_probabilities": [{"id": t, "prob": 0.25} for t in (49, 50)]}
    assert parse_completion(post).logprobs == (math.log(0.25), math.log(0.25))  # post_sampling_probs
    # 0 written as the lowest float (llama.cpp's logarithm(0)): its stand-in for -inf, never recorded
    lowest = {**answer, "completion_probabilities": [lp, {**lp, "id": 50, "logprob": -3.4028234663852886e38}]}
    with pytest.raises(MalformedResponse, match="sampled token 1 is llama-server's stand-in for -inf"):
        parse_completion(lowest)
    assert parse_completion({**lowest, "completion_probabilities": [lp, {**lp, "id": 50, "logprob": -1e38}]})
    assert parse_completion({**answer, "stop_type": "eos"}, stop_ids=(50,)).finish_reason == "stop"
    cut = parse_completion({**answer, "stop_type": "eos"}, stop_ids=(49,))
    assert (cut.token_ids, cut.finish_reason) == ((49,), "stop")
    assert parse_completion(answer, max_tokens=1).token_ids == (49,)


def test_llama_server_openai_endpoint_says_to_use_its_native_one():
    """llama-server's ``/v1/completions`` reads ``logprobs: 0`` as no log-probs and
    never gives token ids: the line named only ``model.kind`` openai or sglang; now it
    names llama-server and ``model.kind = llamacpp``."""

    async def go() -> str:
        async with serve(llamacpp_routes()) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(OpenAICompatPolicy(server.url, "qwen3-4b-q8_0.gguf", config=FAST))
            assert len(server.bodies) == 1  # its first answer (it took 5: the rule for answers of no known shape)
            return one_line(e.value)

    line = asyncio.run(go())
    assert "llama.cpp's llama-server" in line and "model.kind = llamacpp" in line, line


def test_llama_server_context_limit_is_a_truncation():
    from focus.backends.wire import is_context_limit

    body = (
        '{"error":{"code":400,"message":"request (5000 tokens) exceeds the available context size (4096 tokens), '
        'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}'
    )
    assert is_context_limit(400, body)


# ---- a proxy in front of vLLM ----

#: The request fields of OpenAI's completions API: what a proxy that drops the rest keeps.
OPENAI_FIELDS = ("model", "prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs", "stream")


def proxy_routes(mode: str) -> dict[tuple[str, str], Any]:
    """A LiteLLM-style proxy before a vLLM 0.10.2+: ``forwards`` the request, rebuilding
    each choice as ``TextChoices`` (no ``token_ids``); ``drops`` the request fields that are
    not OpenAI's too; ``retokenises`` passes a prompt of ids on as text, which vLLM
    tokenises again (its ``prompt_token_ids`` say so)."""
    inner = vllm_routes(Vllm())
    complete = inner[("POST", "/v1/completions")]

    def proxied(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        if mode == "drops":
            body = {k: v for k, v in body.items() if k in OPENAI_FIELDS}
        if mode == "retokenises":  # decoded without special tokens, tokenised again as bytes
            body = {**body, "prompt": list(FORMAT.codec.decode(body["prompt"]).encode())}
        status, answer = complete(server, body)
        if mode != "retokenises":
            keep = ("finish_reason", "index", "text", "logprobs")
            answer["choices"] = [{k: ch[k] for k in keep} for ch in answer["choices"]]
        return status, answer

    return {**inner, ("POST", "/v1/completions"): proxied}


def test_a_proxy_that_forwards_the_request_keeps_the_rollout_token_exact():
    async def go() -> None:
        async with serve(proxy_routes("forwards")) as server:
            ro = await rollout(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST))
            check_exact(ro, server, server.prompts("/v1/completions", "prompt"))

    asyncio.run(go())


def test_a_proxy_that_drops_the_id_fields_stops_naming_the_proxy():
    async def go() -> str:
        async with serve(proxy_routes("drops")) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST))
            assert len(server.bodies) == 1  # its first answer: every other would be the same (it took 5)
            return one_line(e.value)

    line = asyncio.run(go())
    assert "only token texts" in line and "proxy (LiteLLM, OpenRouter)" in line, line


def test_a_proxy_that_passes_the_prompt_on_as_text_stops_at_the_first_answer():
    """vLLM's ``prompt_token_ids`` said it sampled from other ids than FOCUS sent (the
    chat markers gone): the turns were recorded with the prompt FOCUS sent, a silent
    wrong batch. Now the first such answer stops the collection."""

    async def go() -> str:
        async with serve(proxy_routes("retokenises")) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(OpenAICompatPolicy(server.url, "Qwen/Qwen3-4B", config=FAST))
            assert len(server.bodies) == 1
            return one_line(e.value)

    line = asyncio.run(go())
    assert "sampled from another prompt than the token ids sent" in line and "first difference at position 0" in line


# ---- vLLM's chat endpoint given as the URL ----


@pytest.mark.parametrize(
    "url, root",
    [
        ("http://gpu1:8000/v1/chat/completions", "http://gpu1:8000"),
        ("http://gpu1:8000/v1/completions/", "http://gpu1:8000"),
        ("http://gpu1:8080/completion", "http://gpu1:8080"),
        ("http://gpu1:11434/api/generate", "http://gpu1:11434"),
    ],
)
def test_an_endpoint_url_is_refused_before_anything_starts(url, root):
    """Every request went to ``<url>/v1/completions`` and was refused with 404 at the
    first wave; the chat endpoint would re-tokenise a chat template's text anyway."""
    from tasks.config import FocusConfig

    with pytest.raises(ValueError, match=f"names the endpoint .*set model.url = '{root}'"):
        OpenAICompatPolicy(url)
    with pytest.raises(Exception, match=f"model.url = '{root}'") as e:
        FocusConfig.model_validate({"model": {"kind": "openai", "url": url}})
    assert "\n" not in str(e.value).strip().splitlines()[-1]
    assert OpenAICompatPolicy("http://gpu1:8000/v1").url == "http://gpu1:8000/v1/completions"


# ---- the focus command ----


@pytest.mark.slow  # starts the focus command twice
def test_focus_collect_against_tgi_stops_before_collecting_and_against_llama_server_collects(tmp_path):
    """``focus collect --model-url <TGI>`` wrote an empty batch (8 of 8 rollouts
    "rejected with status 422"), finished the collection id and exited 1; now it stops
    at the first answer, exit 2, one line, no batch. ``model.kind = llamacpp`` collects
    (with ``--model-url``, which names the server, not its kind),
    and every actor row holds a prompt the server was sent and exactly what it sampled
    for it."""
    import pyarrow.dataset as ds

    store = str(tmp_path / "runs")

    async def go() -> tuple[Any, Any, set[tuple[tuple[int, ...], ...]]]:
        async with serve(tgi_routes()) as tgi:
            args = ["collect", "--model-url", tgi.url, "--set", "model.model=Qwen/Qwen3-4B", "--store", store]
            refused = await asyncio.to_thread(run_focus, tmp_path, [*args, "--collection-id", "t", "--tasks", "2"])
        async with serve(llamacpp_routes(LlamaCpp(eog=False))) as llama:
            # --model-url with the kind named beside it (it had forced kind openai)
            args = ["collect", "--model-url", llama.url, "--set", "model.kind=llamacpp", "--store", store]
            done = await asyncio.to_thread(run_focus, tmp_path, [*args, "--collection-id", "l", "--tasks", "2"])
            served = {
                (tuple(p), tuple(ids), tuple(lps))
                for p, (ids, lps) in zip(llama.prompts("/completion", "prompt"), llama.sampled, strict=True)
            }
        return refused, done, served

    refused, done, served = asyncio.run(go())
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the model server at") and "HuggingFace TGI" in lines[0]
    assert not (tmp_path / "runs" / "batches" / "t").exists()
    assert done.returncode == 0, done.stderr
    rows = ds.dataset(tmp_path / "runs" / "batches" / "l" / "iter-000000" / "actor").to_table().to_pylist()
    assert rows and all(r["policy_version"] == "llamacpp" for r in rows)
    recorded = {(tuple(r["prompt_ids"]), tuple(r["completion_ids"]), tuple(r["logprobs"])) for r in rows}
    assert recorded <= served


# ---- llama-server's dialect over real samples ----


class LlamaServerFront:
    """A loopback server that answers ``/completion`` as llama-server does, from the
    embedded model's ``/generate`` (real samples): it passes no stop ids on (llama-server
    has none), and answers ``tokens``, ``completion_probabilities`` and ``stop_type``.
    ``eog=False``: the stop id is no end-of-generation token of the model (``ignore_eos``
    upstream), so the model samples on past it to ``n_predict``."""

    def __init__(self, upstream: str, eog: bool = True) -> None:
        import threading

        self.upstream, self.url, self.eog = upstream, "", eog
        #: Answers that went on past the stop id.
        self.longer = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LlamaServerFront:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        import aiohttp
        from aiohttp import web

        self._stop = asyncio.Event()
        session = aiohttp.ClientSession()

        async def completion(request: web.Request) -> web.Response:
            body = await request.json()
            sp = {
                "max_new_tokens": body["n_predict"],
                "temperature": body["temperature"],
                "top_p": body["top_p"],
                "top_k": body["top_k"] if body["top_k"] > 0 else -1,
                "min_p": body["min_p"],
                "repetition_penalty": body["repeat_penalty"],
                "skip_special_tokens": False,
                "ignore_eos": not self.eog,
            }
            if "seed" in body:
                sp["sampling_seed"] = body["seed"]
            req = {"input_ids": body["prompt"], "sampling_params": sp, "return_logprob": True, "stream": False}
            async with session.post(f"{self.upstream}/generate", json=req) as resp:
                got = await resp.json()
            triples = got["meta_info"]["output_token_logprobs"]
            ids = [t for _, t, _ in triples]
            self.longer += EOT in ids[:-1]
            finish = got["meta_info"]["finish_reason"]
            kind = finish.get("type") if isinstance(finish, dict) else finish
            probs = [  # n_probs 1: one top log-prob (here the sampled token's)
                {"id": t, "token": "", "bytes": [], "logprob": lp, "top_logprobs": [{"id": t, "logprob": lp}]}
                for lp, t, _ in triples
            ]
            answer = {
                "content": "",
                "tokens": [t for _, t, _ in triples] if body.get("return_tokens") else [],
                "stop": True,
                "stop_type": "limit" if kind == "length" else "eos",
                "timings": {"cache_n": 0},
                "completion_probabilities": probs,
            }
            return web.json_response(answer)

        app = web.Application()
        app.router.add_post("/completion", completion)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._ready.set()
        await self._stop.wait()
        await session.close()
        await runner.cleanup()


class TestLlamaCppConformance(PolicyConformance):
    @pytest.fixture(autouse=True)
    def _server(self, local_model_server):
        with LlamaServerFront(local_model_server.url) as front:
            self.front = front
            yield

    def make_policy(self):
        return LlamaCppPolicy(self.front.url, vocab_size=FORMAT.codec.vocab_size, config=FAST)


def test_llama_server_cut_at_the_stop_id_gives_the_samples_a_server_that_stops_there_gives(local_model_server):
    """The same seeded requests to the embedded model: as SGLang's ``/generate`` with
    the stop id (the server stops there) and through llama-server's dialect without it,
    to a model whose stop id is no end-of-generation token (it samples on to
    ``n_predict``; the client cuts after the stop id): the same ids, log-probs and finish
    reasons, bit for bit."""
    from focus.env import Message
    from focus.toy import opening_text

    prompt = FORMAT.codec.render([Message("user", opening_text(4))])

    async def samples(policy: Any) -> list[tuple[Any, ...]]:
        try:
            out = []
            for s in range(12):
                params = SamplingParams(max_tokens=1 + s % 3, temperature=1.0, seed=s, stop_token_ids=(EOT,))
                c = await policy.sample(prompt, params)
                out.append((c.token_ids, c.logprobs, c.finish_reason))
            return out
        finally:
            await policy.aclose()

    direct = asyncio.run(samples(SGLangPolicy(local_model_server.url, config=FAST)))
    with LlamaServerFront(local_model_server.url, eog=False) as front:
        via = asyncio.run(samples(LlamaCppPolicy(front.url, config=FAST)))
        sampled_on = front.longer
    assert via == direct
    assert sampled_on > 0  # answers the client cut after the stop id
    assert {f for _, _, f in direct} == {"stop", "length"}  # both kinds of ending are compared


@pytest.mark.parametrize(
    "said",
    [{"system_fingerprint": "b0-unknown"}, {"system_fingerprint": None, "timings": {"predicted_per_second": 41.5}}],
    ids=["built without git", "fingerprint gone, timings kept"],
)
def test_llama_server_built_without_git_is_named_at_its_first_answer(said):
    """A llama-server built where git could not name the commit (a source tarball, a
    package build) gives its build as ``b0-unknown`` (``cmake/build-info.cmake``'s
    fallback), and answers ``logprobs: null`` to ``logprobs: 0``: the line said only
    "the choice has no 'logprobs.token_logprobs' (was 'logprobs' dropped?)". Its answers
    also carry ``timings`` (``server-task.cpp``), which no other server's do."""
    routes = llamacpp_routes()
    complete = routes[("POST", "/v1/completions")]

    def built(server: Server, body: dict[str, Any]) -> tuple[int, Any]:
        status, answer = complete(server, body)
        answer.update(said)
        if answer["system_fingerprint"] is None:
            del answer["system_fingerprint"]
        return status, answer

    async def go() -> str:
        async with serve({**routes, ("POST", "/v1/completions"): built}) as server:
            with pytest.raises(UnreadableAnswers) as e:
                await rollout(OpenAICompatPolicy(server.url, "qwen3-4b-q8_0.gguf", config=FAST))
            assert len(server.bodies) == 1
            return one_line(e.value)

    line = asyncio.run(go())
    assert "llama.cpp's llama-server" in line and "model.kind = llamacpp" in line, line
