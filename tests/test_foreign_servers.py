"""Model servers that are not the project's: vLLM's and SGLang's answer shapes, and what
the clients do with answers a real server sends that the embedded one never does.

The shapes follow vLLM's OpenAI protocol models (``CompletionResponse``,
``CompletionResponseChoice``, ``CompletionLogProbs``, ``UsageInfo`` in
``vllm/entrypoints/openai/protocol.py``: ``usage.prompt_tokens_details`` may be null,
``stop_reason`` and ``prompt_logprobs`` ride along, ``token_ids`` is null unless
``return_token_ids`` is honoured) and SGLang's ``/generate`` (``meta_info`` with
``output_token_logprobs`` triples whose text may be a string, ``finish_reason`` objects
with ``matched``, a ``weight_version``). The server-side cases run the embedded model
behind :class:`~focus.testing.faults.FaultProxy` with ``reshape``, so the ids and
log-probs are real samples and token exactness is checked against the same server
answering directly.
"""

from __future__ import annotations

import copy
import gzip
import json
from typing import Any

import httpx
import numpy as np
import pytest
from aiohttp import web
from fixtures.prefect import run_focus

from focus.backends import HttpConfig, OpenAICompatPolicy, SGLangPolicy
from focus.backends.http import MalformedResponse
from focus.backends.llamacpp import parse_completion as parse_llamacpp
from focus.backends.openai_compat import parse_completion, parse_completions
from focus.backends.sglang import parse_generate
from focus.backends.wire import encode
from focus.env import Message
from focus.format import ByteCodec
from focus.policy import BadResponse, SamplingParams, UnreadableAnswers
from focus.testing import run
from focus.testing.faults import FaultProxy
from focus.toy import opening_text

pytestmark = pytest.mark.timeout(120)

CODEC = ByteCodec()
PROMPT = CODEC.render([Message("user", opening_text(4))])
#: Short retries, no outage wait; no read timeout a slow machine could miss.
FAST = HttpConfig(backoff_s=0.01, backoff_max_s=0.05, max_retries=3, timeout_s=60, outage_wait_s=0)


def vllm_answer(ids: list[int], lps: list[float], finish: str = "stop", **extra: Any) -> dict[str, Any]:
    """A completions answer with every field vLLM's protocol model writes."""
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "Qwen/Qwen3-4B",
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "logprobs": {
                    "text_offset": list(range(len(ids))),
                    "token_logprobs": lps,
                    "tokens": [f"token_id:{t}" for t in ids],
                    "top_logprobs": [None] * len(ids),
                },
                "finish_reason": finish,
                "stop_reason": None,
                "prompt_logprobs": None,
                "token_ids": ids,
                "prompt_token_ids": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": None},
        "kv_transfer_params": None,
        **extra,
    }


def test_vllm_answers_with_optional_fields_missing_or_null_keep_their_ids():
    base = vllm_answer([5, 6], [-0.5, -9998.5], finish="length")
    variants = [base]
    no_ids = copy.deepcopy(base)
    no_ids["choices"][0]["token_ids"] = None  # return_token_ids not honoured: ids from 'token_id:<id>'
    variants.append(no_ids)
    for usage in (None, {}, {"prompt_tokens_details": {"cached_tokens": None}}):
        v = copy.deepcopy(base)
        v["usage"] = usage
        variants.append(v)
    no_usage = copy.deepcopy(base)
    del no_usage["usage"]
    variants.append(no_usage)
    for v in variants:
        c = parse_completion(v)
        assert (c.token_ids, c.logprobs, c.finish_reason) == ((5, 6), (-0.5, -9998.5), "length")
        assert c.policy_version == "Qwen/Qwen3-4B" and c.cached_prompt_tokens is None
    assert parse_completion(vllm_answer([7], [-1.0], finish="stop", stop_reason=7)).finish_reason == "stop"


def test_vllms_stand_in_for_minus_infinity_on_a_sampled_token_is_malformed():
    """vLLM writes a log-prob below -9999 (-inf included) as -9999.0. On a sampled token
    it was recorded as an ordinary behaviour log-prob, where a trainer's importance ratio
    exp(new - old) overflows; now the answer is malformed (retried, never recorded).
    The value in the top log-probs of other tokens is no concern (never read)."""
    with pytest.raises(MalformedResponse, match=r"log-prob -9999.0 of sampled token 1 is vLLM's stand-in for -inf"):
        parse_completion(vllm_answer([5, 6], [-0.5, -9999.0], finish="length"))
    with pytest.raises(MalformedResponse, match="stand-in for -inf"):
        parse_completion(vllm_answer([5], [-9999], finish="length"))  # an int in the JSON
    assert parse_completion(vllm_answer([5], [-9998.99], finish="length")).logprobs == (-9998.99,)


def test_chat_format_log_probs_name_the_server_only_when_it_is_known():
    """Log-probs in the chat format ({"content": [...]}) on /v1/completions: the line
    named llama-server whatever the server; now llama-server only where its build
    fingerprint says so, otherwise what the answer names of the server, or nothing."""
    answer = vllm_answer([5], [-0.5], finish="length")
    answer["choices"][0]["logprobs"] = {"content": [{"id": 5, "token": "x", "logprob": -0.5}]}
    answer["system_fingerprint"], answer["model"] = "fp_44709d6fcb", "gateway-model"
    with pytest.raises(MalformedResponse) as e:
        parse_completion(answer)
    line = str(e.value)
    assert "this is llama" not in line, line
    assert "chat format" in line and "system_fingerprint 'fp_44709d6fcb', model 'gateway-model'" in line, line
    answer["system_fingerprint"] = answer["model"] = None
    with pytest.raises(MalformedResponse, match=r"chat format \('logprobs.content'\) with no token ids: FOCUS"):
        parse_completion(answer)
    answer["system_fingerprint"] = "b6710-74b8fc17"  # llama-server's build
    with pytest.raises(MalformedResponse, match="this is llama.cpp's llama-server"):
        parse_completion(answer)


def test_answers_no_server_should_send_are_malformed_naming_what_they_hold():
    """Answers the parsers took or misread: an error sent with status 200 (a proxy's,
    or a server's own ``{"object": "error"}``) was "no 'choices' in the answer", its
    message dropped; choices of an ``n`` answer without their ``index`` raised a
    ``TypeError`` comparing None, and one choice numbered 2 of 3 was taken as sample 0
    (seed + 2's tokens recorded as seed + 0's); a negative id passed where the policy
    knows no vocabulary size."""
    said = {"object": "error", "message": "This model's maximum context length is 4096 tokens.", "code": 400}
    with pytest.raises(MalformedResponse, match="no 'choices' in the answer but an error: This model's maximum"):
        parse_completion(said)
    with pytest.raises(MalformedResponse, match="no 'meta_info' in the answer but an error: upstream timed out"):
        parse_generate({"error": {"message": "upstream\ntimed out", "code": 504}})
    with pytest.raises(MalformedResponse, match=r"^no 'choices' in the answer$"):
        parse_completion({"choices": []})
    two = vllm_answer([5], [-0.5])
    two["choices"] = [{**two["choices"][0], "index": None}, {**two["choices"][0], "index": None}]
    with pytest.raises(
        MalformedResponse, match=r"asked for 2 sample\(s\), the answer's choices are numbered \[None, None\]"
    ):
        parse_completions(two, 2)
    third = vllm_answer([5], [-0.5])
    third["choices"][0]["index"] = 2
    with pytest.raises(MalformedResponse, match=r"asked for 3 sample\(s\), the answer's choices are numbered \[2\]"):
        parse_completions(third, 3)
    assert [c.token_ids for c in parse_completions(vllm_answer([5], [-0.5]), 3)] == [(5,)]  # n ignored: sample 0
    with pytest.raises(MalformedResponse, match=r"asked for 1 sample\(s\), the answer's choices are numbered \[2\]"):
        parse_completion(third)  # one sample asked for, and the answer's one choice is another
    both = vllm_answer([5], [-0.5])
    both["choices"] = [{**both["choices"][0], "index": 1, "token_ids": [7]}, both["choices"][0]]
    with pytest.raises(MalformedResponse, match=r"asked for 1 sample\(s\), the answer's choices are numbered \[1, 0\]"):
        parse_completion(both)  # choices[0] was taken: sample 1's tokens
    negative = vllm_answer([-1], [-0.5])
    with pytest.raises(MalformedResponse, match="not a list of token ids"):
        parse_completion(negative)
    negative["choices"][0]["token_ids"] = None  # the id from 'token_id:-1'
    with pytest.raises(MalformedResponse, match="not a list of token ids"):
        parse_completion(negative)
    with pytest.raises(MalformedResponse, match="is not \\[logprob, token_id, text\\]"):
        parse_generate({"meta_info": {"output_token_logprobs": [[-0.5, -1, None]], "finish_reason": {"type": "stop"}}})
    llama = {"tokens": [-1], "completion_probabilities": [{"id": -1, "logprob": -0.5}], "stop_type": "eos"}
    with pytest.raises(MalformedResponse, match="negative token id"):
        parse_llamacpp(llama)


def test_an_answer_the_server_ended_itself_is_retried_not_recorded():
    """``abort`` (vLLM, SGLang: a weights update with ``abort_all_requests``, an admin
    abort) and vLLM's ``error`` end a sample at a place the seed does not decide: such
    an answer was recorded as a turn; now it is malformed (retried, never stored)."""
    for finish in ("abort", "error"):
        with pytest.raises(MalformedResponse, match=rf"finish_reason '{finish}' after 1 token"):
            parse_completion(vllm_answer([5], [-0.5], finish=finish))
    aborted = {
        "text": "a",
        "output_ids": [3],
        "meta_info": {
            "id": "x",
            "finish_reason": {"type": "abort", "message": "Abort before weight update."},
            "output_token_logprobs": [[-0.1, 3, "a"]],
            "weight_version": "v1",
        },
    }
    with pytest.raises(MalformedResponse, match="'abort' after 1 token.*Abort before weight update"):
        parse_generate(aborted)


#: A good answer of each kind: what the server answers requests other than the test's.
GOOD = {
    OpenAICompatPolicy: vllm_answer([5], [-0.5]),
    SGLangPolicy: {
        "text": "a",
        "output_ids": [3],
        "meta_info": {"finish_reason": "stop", "output_token_logprobs": [[-0.1, 3, "a"]]},
    },
}


def _mock(answer: Any, others: Any = None, bodies: list[bytes] | None = None) -> httpx.MockTransport:
    """``answer`` to the first POST's body, ``others`` (default ``answer``) to any other
    request (a GET too: SGLang's client asks ``/server_info`` at its first seeded call)."""
    seen = [] if bodies is None else bodies

    def reply(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json=answer if others is None else others)
        seen.append(request.content)
        return httpx.Response(200, json=answer if others is None or request.content == seen[0] else others)

    return httpx.MockTransport(reply)


@pytest.mark.parametrize(
    "policy_cls, answer",
    [
        (OpenAICompatPolicy, {"choices": ["5 6"]}),  # a choice that is not an object
        (OpenAICompatPolicy, {**vllm_answer([5], [-0.5]), "usage": [3, 2]}),  # usage that is not an object
        (SGLangPolicy, {"meta_info": {"output_token_logprobs": [], "finish_reason": "stop"}, "output_ids": 3}),
    ],
)
def test_an_answer_of_another_shape_is_a_bad_response_not_a_crash(policy_cls, answer):
    """An answer whose parts have the wrong JSON type raised ``AttributeError`` out of
    the parser: not retried, and the rollout failed as an ``error``, not as the bad
    response it is (which reruns it and stops the collection if it persists). The
    server answers this one request so; the probe the client sends beside it (another
    prompt) reads fine. (Every request answered so: tests/test_unreadable_answers.py.)"""
    bodies: list[bytes] = []
    policy = policy_cls("http://127.0.0.1:1", config=FAST, transport=_mock(answer, GOOD[policy_cls], bodies))

    async def go() -> None:
        try:
            await policy.sample(PROMPT, SamplingParams(max_tokens=4, seed=1))
        finally:
            await policy.aclose()

    with pytest.raises(BadResponse, match="failed after 4 attempt.*malformed response"):
        run(go())
    assert len(bodies) == 5 and len(set(bodies)) == 2  # 4 attempts and one probe


def old_vllm(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """vLLM before ``return_token_ids``, with the rest of its protocol's fields."""
    ch = answer["choices"][0]
    ids = ch.pop("token_ids")
    assert ch["logprobs"]["tokens"] == [f"token_id:{t}" for t in ids]
    ch.update(stop_reason=None, prompt_logprobs=None)
    ch["logprobs"].update(text_offset=list(range(len(ids))), top_logprobs=[None] * len(ids))
    answer.pop("usage", None)
    answer.pop("policy_version", None)
    return {**answer, "model": "served-name", "system_fingerprint": None, "kv_transfer_params": None}


def sglang_strings(answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """SGLang with token texts in the triples, no ``output_ids``, extra timing fields."""
    meta = answer["meta_info"]
    meta["output_token_logprobs"] = [[lp, t, chr(t % 128)] for lp, t, _ in meta["output_token_logprobs"]]
    meta.update(e2e_latency=0.01, spec_verify_ct=0)
    answer.pop("output_ids")
    return answer


async def _samples(policy: Any, seeds: range) -> list[tuple[tuple[int, ...], tuple[float, ...], str]]:
    try:
        out = []
        for s in seeds:
            c = await policy.sample(PROMPT, SamplingParams(max_tokens=6, temperature=1.0, seed=s))
            out.append((c.token_ids, c.logprobs, c.finish_reason))
        return out
    finally:
        await policy.aclose()


@pytest.mark.integration
@pytest.mark.parametrize("policy_cls, reshape", [(OpenAICompatPolicy, old_vllm), (SGLangPolicy, sglang_strings)])
def test_another_servers_dialect_gives_the_same_tokens(local_model_server, policy_cls, reshape):
    """The same seeded requests, answered directly and in the other server's shape: the
    same ids, log-probs and finish reasons, bit for bit (nothing re-tokenised)."""
    direct = run(_samples(policy_cls(local_model_server.url, config=FAST), range(4)))
    with FaultProxy(local_model_server.url, reshape=reshape) as proxy:
        via = run(_samples(policy_cls(proxy.url, config=FAST), range(4)))
    assert via == direct
    assert {f for _, _, f in direct} <= {"stop", "length"}


class AbortFirst:
    """Answers the first generation request as aborted after its first token (what
    SGLang sends for requests in flight when weights are updated with
    ``abort_all_requests``); later ones pass."""

    def __init__(self) -> None:
        self.aborted = 0

    def __call__(self, answer: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
        if self.aborted:
            return answer
        self.aborted += 1
        meta = answer["meta_info"]
        meta["output_token_logprobs"] = meta["output_token_logprobs"][:1]
        meta["finish_reason"] = {"type": "abort", "message": "Abort before weight update."}
        answer["output_ids"] = answer["output_ids"][:1]
        return answer


@pytest.mark.integration
def test_an_aborted_answer_is_sampled_again_with_its_seed(local_model_server):
    direct = run(_samples(SGLangPolicy(local_model_server.url, config=FAST), range(1)))
    reshape = AbortFirst()
    with FaultProxy(local_model_server.url, reshape=reshape) as proxy:
        policy = SGLangPolicy(proxy.url, config=FAST)
        via = run(_samples(policy, range(1)))
    assert reshape.aborted == 1 and via == direct
    assert policy.stats()["retries"] == {"malformed response": 1}


@pytest.mark.integration
def test_a_body_cut_mid_way_is_retried(local_model_server):
    """The server's headers promise N bytes, half arrive, the connection closes."""
    direct = run(_samples(OpenAICompatPolicy(local_model_server.url, config=FAST), range(2)))
    with FaultProxy(local_model_server.url) as proxy:
        proxy.queue("cut", count=2)
        policy = OpenAICompatPolicy(proxy.url, config=FAST)
        via = run(_samples(policy, range(2)))
        assert proxy.injected["cut"] == 2
    assert via == direct
    assert sum(policy.stats()["retries"].values()) == 2


@pytest.mark.integration
@pytest.mark.slow  # starts the focus command
def test_a_model_name_the_server_does_not_serve_stops_the_command_before_it_starts(local_model_server, tmp_path):
    """vLLM answers a request naming another model with 404, so a collection against a
    server serving another name than ``model.model`` (``focus-tinylm`` when unset)
    failed every rollout as a refused request, wrote an empty batch, finished the
    collection id and exited 0. Now the command asks ``/v1/models`` first."""

    from focus.backends.openai_compat import unserved_model

    url = local_model_server.url
    assert unserved_model(url, "focus-tinylm") is None and unserved_model(f"{url}/v1", "focus-tinylm") is None
    assert unserved_model(url, "Qwen/Qwen3-4B") == (
        f"model.model 'Qwen/Qwen3-4B' is not served at {url} (it serves 'focus-tinylm'); "
        "set it, e.g. --set model.model=focus-tinylm"
    )
    assert unserved_model("http://127.0.0.1:1", "x") is None  # not up yet: the run waits for it as before
    args = ["collect", "--model-url", url, "--set", "model.model=Qwen/Qwen3-4B", "--store", str(tmp_path / "runs")]
    done = run_focus(tmp_path, [*args, "--collection-id", "c1", "--tasks", "2"])
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: {unserved_model(url, 'Qwen/Qwen3-4B')}"]
    assert not (tmp_path / "runs" / "batches").exists()


@pytest.mark.integration
@pytest.mark.slow  # starts the focus command
def test_a_server_that_refuses_every_request_ends_the_command_with_status_2(scripted, tmp_path):
    """A wrong key, path or model name makes the server refuse every request (a 4xx is
    not retried): every rollout failed, and the command exited 0 with an empty batch.
    Now the first wave stops the collection unfinished (``RequestsRefused``, the
    library's): exit 2 with one line naming the cause, on the first run and on a rerun,
    and no batch."""

    scripted.answers[:] = [(401, {}, {"error": {"message": "invalid API key", "code": 401}})]
    args = ["collect", "--model-url", scripted.url, "--store", str(tmp_path / "runs"), "--collection-id", "c1"]
    for _run in range(2):
        done = run_focus(tmp_path, [*args, "--tasks", "2", "--json"])
        assert done.returncode == 2, done.stderr[-2000:]
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(
            "error: the model service refused every request (8 of 8 rollouts of the wave, status 401)"
        )
        assert "invalid API key" in last and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "runs" / "batches").exists()


async def _raw_server(body: bytes, **headers: str) -> tuple[web.AppRunner, str]:
    """A server on 127.0.0.1 answering every ``/v1/completions`` with ``body`` as it is."""

    async def answer(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": "application/json", **headers})

    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


#: A gzip stream with its deflate data garbled (the header and the trailer intact).
_GZIP = gzip.compress(json.dumps(vllm_answer([5], [-0.5])).encode())
CORRUPT_GZIP = _GZIP[:10] + bytes(b ^ 0x55 for b in _GZIP[10:40]) + _GZIP[40:]


@pytest.mark.integration
@pytest.mark.parametrize(("encoding", "body"), [("gzip", CORRUPT_GZIP), ("br", b"\x8b\x02\x80garbled")])
def test_a_body_whose_encoding_cannot_be_undone_is_an_answer_not_an_outage(encoding, body):
    """aiohttp raises a body it cannot decode (a corrupt gzip stream; brotli, which the
    client does not ask for, without the Brotli package) as it does a connection cut
    mid-body: it was a "connection" failure, so a server answering every request so was
    waited for as down for ``outage_wait_s`` and reported as an outage. It is a
    malformed answer: every request answered so stops the collection at once."""
    config = HttpConfig(backoff_s=0.01, backoff_max_s=0.05, max_retries=3, timeout_s=60, outage_wait_s=5)

    async def go() -> None:
        runner, url = await _raw_server(body, **{"Content-Encoding": encoding})
        policy = OpenAICompatPolicy(url, config=config)
        try:
            await policy.sample(PROMPT, SamplingParams(max_tokens=4, seed=1))
        finally:
            await policy.aclose()
            await runner.cleanup()

    with pytest.raises(UnreadableAnswers, match="malformed|decode content-encoding") as e:
        run(go())
    assert "decode content-encoding" in str(e.value) and "has not answered" not in str(e.value)


@pytest.mark.integration
def test_a_token_text_that_is_not_utf8_leaves_the_ids_and_logprobs_readable():
    """A server that writes a token's text cut inside a UTF-8 character as raw bytes
    (a byte-fallback token) sends a body that is not UTF-8: it failed as "not JSON" on
    every try, though FOCUS reads only the ids and log-probs beside that text."""
    answer = vllm_answer([226, 128], [-0.5, -0.25])
    answer["usage"]["prompt_tokens"] = len(PROMPT)
    answer["choices"][0]["text"] = "@CUT@"
    answer["choices"][0]["logprobs"]["top_logprobs"] = [{"@CUT@": -0.5}, {"@CUT@": -0.25}]
    body = json.dumps(answer).encode().replace(b"@CUT@", b"\xe2\x80")

    async def go() -> Any:
        runner, url = await _raw_server(body)
        policy = OpenAICompatPolicy(url, config=FAST)
        try:
            return await policy.sample(PROMPT, SamplingParams(max_tokens=4, seed=1))
        finally:
            await policy.aclose()
            await runner.cleanup()

    completion = run(go())
    assert (completion.token_ids, completion.logprobs) == ((226, 128), (-0.5, -0.25))


@pytest.mark.integration
def test_bodies_go_out_as_json_dumps_would_and_lenient_answers_are_read():
    """Request bodies are encoded by ``orjson`` (a tenth of ``json.dumps``'s CPU per
    call), answers decoded by it where they are strict JSON. What a server gets is the
    JSON ``json.dumps`` gave: a ``logit_bias`` keyed by token ids (``int`` keys, which
    ``orjson`` refuses by default) and non-ASCII text; and an answer a Python server
    wrote with ``json.dumps`` holding ``-Infinity`` (a top log-prob of an impossible
    token, which strict JSON has no word for) is read as before, not "malformed"."""
    answer = vllm_answer([5, 6], [-0.5, -0.25])
    answer["usage"]["prompt_tokens"] = len(PROMPT)
    answer["choices"][0]["logprobs"]["top_logprobs"] = [{"a": -0.5, "é": float("-inf")}, {"b": -0.25}]
    sent: list[bytes] = []

    async def go() -> Any:
        async def answer_it(request: web.Request) -> web.Response:
            sent.append(await request.read())
            return web.Response(body=json.dumps(answer).encode(), headers={"Content-Type": "application/json"})

        app = web.Application()
        app.router.add_post("/v1/completions", answer_it)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        extra = {"logit_bias": {7: -100.0}, "user": "zoë", "top_p": np.float64(0.9)}  # (a sweep's numpy float)
        policy = OpenAICompatPolicy(url, config=FAST, extra_body=extra)
        try:
            return await policy.sample(PROMPT, SamplingParams(max_tokens=4, seed=1)), policy
        finally:
            await policy.aclose()
            await runner.cleanup()

    completion, policy = run(go())
    assert (completion.token_ids, completion.logprobs) == ((5, 6), (-0.5, -0.25))
    expected = json.loads(json.dumps(policy.request_body(PROMPT, SamplingParams(max_tokens=4, seed=1))))
    assert json.loads(sent[0]) == expected and expected["logit_bias"] == {"7": -100.0}
    assert expected["user"] == "zoë" and "zoë".encode() in sent[0]  # UTF-8 on the wire, the same string read
    assert expected["top_p"] == 0.9


class _Fraction(float):
    """A ``float`` subclass of another library (``orjson`` writes only ``float`` itself)."""


@pytest.mark.parametrize(
    "value",
    [np.float64(0.7), np.int64(3), np.float32(0.5), 2**70, _Fraction(0.25), {5: np.int64(-100)}],
    ids=["np.float64", "np.int64", "np.float32", "int past 64 bits", "float subclass", "numpy in a dict"],
)
def test_a_body_holding_numbers_orjson_does_not_write_alone_still_goes_out(value):
    # a request body's values as a user's code makes them: what json.dumps wrote (or
    # what it would have written as numbers) goes out as those JSON numbers
    body = {"prompt": [1, 2], "x": value}
    got = json.loads(encode(body))
    plain = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, dict):
        plain = {str(k): v.item() for k, v in value.items()}
    assert got == {"prompt": [1, 2], "x": plain}
