"""The embedded server against what vLLM and SGLang themselves do (their serving code, not
this server's): a client that disconnects aborts its request, streams never send what the
answer removes, chunk layout, metric types, version labels across a reload, and SGLang's
meta_info keys and request ids."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from focus.backends import LocalModelServer
from focus.env import Message
from focus.format import ByteCodec
from focus.toy import opening_text

CODEC = ByteCodec()
PROMPT = CODEC.render([Message("user", opening_text(11))])
MESSAGES = [{"role": "user", "content": opening_text(11)}]
LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs")


def sse(text: str) -> list[dict]:
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def samples(url: str) -> dict[str, float]:
    """Every sample of ``/metrics`` by name (label sets summed; also by name and
    ``finished_reason``), as Prometheus' parser reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            for key in (s.name, f"{s.name}:{s.labels.get('finished_reason')}"):
                out[key] = out.get(key, 0.0) + s.value
    return out


def ascii_text(url: str) -> tuple[int, str]:
    """A seed whose 12-token answer (end of turn banned) is printable ASCII, and the answer."""
    for seed in range(20):
        body = {"prompt": PROMPT, "max_tokens": 12, "min_tokens": 12, "seed": seed}
        text = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]["text"]
        if len(text) == 12 and text.isascii() and text.isprintable() and len(set(text)) > 4:
            return seed, text
    raise AssertionError("no seed gives a printable answer")


# --- a client that goes away -------------------------------------------------------------------

LONG = 4000  # tokens a request would decode if nobody stopped it (seconds of decoding)


def _open(url: str, path: str, body: dict) -> socket.socket:
    """Send ``body`` on a raw connection and leave the answer unread."""
    u = urlsplit(url)
    sock = socket.create_connection((u.hostname, u.port))
    data = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def _wait(url: str, until, timeout_s: float = 120.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        now = samples(url)
        if until(now) or time.monotonic() > deadline:
            return now
        time.sleep(0.02)


def test_non_streamed_requests_stop_decoding_when_their_client_disconnects(local_model_server):
    """vLLM answers a non-streamed request's disconnect by aborting it (its serving code
    catches the CancelledError of the request's generator and the engine aborts the
    request); SGLang's tokenizer manager aborts it too. Here: three requests of 4,000
    tokens on the three generation routes; their clients hang up once they run."""
    url = local_model_server.url
    bodies = [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True, "seed": 1}),
        ("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": LONG, "ignore_eos": True, "seed": 2}),
        ("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True}}),
    ]
    before = samples(url)
    socks = [_open(url, path, body) for path, body in bodies]
    try:
        started = _wait(url, lambda m: m["vllm:num_requests_running"] == len(socks))
        assert started["vllm:num_requests_running"] == len(socks)
    finally:
        for s in socks:
            s.close()
    after = _wait(url, lambda m: m["vllm:num_requests_running"] == 0)
    assert after["vllm:num_requests_running"] == 0
    decoded = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert decoded < LONG, f"{decoded:.0f} tokens decoded for 3 clients that left (each asked {LONG})"
    # they finished as aborted, and nothing decodes afterwards
    aborted = after["vllm:request_success_total:abort"] - before.get("vllm:request_success_total:abort", 0.0)
    assert aborted == len(socks)
    time.sleep(0.3)
    assert samples(url)["vllm:generation_tokens_total"] == after["vllm:generation_tokens_total"]


def test_a_hang_up_passes_through_the_fault_proxy(local_model_server, fault_proxy):
    """The load benchmark's proxy stands for the network: a client's hang-up closes the
    forwarded request too, so the server aborts what nobody waits for (a hedge that
    lost, an attempt that timed out)."""
    url = local_model_server.url
    before = samples(url)
    sock = _open(fault_proxy.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": LONG, "ignore_eos": True})
    try:
        assert _wait(url, lambda m: m["vllm:num_requests_running"] == 1)["vllm:num_requests_running"] == 1
    finally:
        sock.close()
    after = _wait(url, lambda m: m["vllm:num_requests_running"] == 0)
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < LONG
    assert after["vllm:request_success_total:abort"] - before.get("vllm:request_success_total:abort", 0.0) == 1


# --- stop strings in streams -------------------------------------------------------------------


def test_streams_never_send_what_the_answer_removes(local_model_server):
    """vLLM's detokenizer checks stop strings before it emits a token's text and holds
    back the last ``max(len(stop)) - 1`` characters until they cannot start one: the
    deltas of a stream add up to the non-streamed text, and no delta holds text the answer
    removes. SGLang's running ``text`` only ever grows into its final text."""
    url = local_model_server.url
    seed, text = ascii_text(url)
    stops = [[text[3]], [text[5:7]], [text[8:11], text[6:7]]]
    for stop in stops:
        cut = min(text.find(s) for s in stop)
        want = text[:cut]
        body = {"prompt": PROMPT, "max_tokens": 12, "min_tokens": 12, "seed": seed, "stop": stop}
        whole = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]
        assert whole["text"] == want and whole["finish_reason"] == "stop"
        events = sse(httpx.post(f"{url}/v1/completions", json={**body, "stream": True}).text)
        deltas = [e["choices"][0]["text"] for e in events]
        assert "".join(deltas) == want, (stop, deltas)
        chat = {"messages": MESSAGES, "max_tokens": 12, "min_tokens": 12, "seed": seed, "stop": stop}
        whole = httpx.post(f"{url}/v1/chat/completions", json=chat).json()["choices"][0]["message"]["content"]
        assert whole == want
        events = sse(httpx.post(f"{url}/v1/chat/completions", json={**chat, "stream": True}).text)
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == want
        params = {"max_new_tokens": 12, "min_new_tokens": 12, "sampling_seed": seed, "stop": stop}
        sg = {"input_ids": PROMPT, "sampling_params": params}
        assert httpx.post(f"{url}/generate", json=sg).json()["text"] == want
        running = [e["text"] for e in sse(httpx.post(f"{url}/generate", json={**sg, "stream": True}).text)]
        assert running[-1] == want and all(want.startswith(t) for t in running), (stop, running)


# --- stream chunk layout -------------------------------------------------------------------------


def test_every_stream_chunk_carries_finish_reason_stop_reason_and_logprobs(local_model_server):
    """vLLM builds every chunk's choice with ``logprobs``, ``finish_reason`` and (completions)
    ``stop_reason`` set, null until the last, and dumps with ``exclude_unset``: the keys are
    on every chunk, as in OpenAI's streams."""
    url = local_model_server.url
    body = {"prompt": PROMPT, "max_tokens": 4, "min_tokens": 4, "seed": 3, "stream": True}
    events = sse(httpx.post(f"{url}/v1/completions", json=body).text)
    assert len(events) >= 2
    for e in events:
        choice = e["choices"][0]
        assert {"index", "text", "logprobs", "finish_reason", "stop_reason"} <= set(choice), choice
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    chat = {"messages": MESSAGES, "max_tokens": 4, "min_tokens": 4, "seed": 3, "stream": True}
    events = sse(httpx.post(f"{url}/v1/chat/completions", json=chat).text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    for e in events:
        assert {"index", "delta", "logprobs", "finish_reason"} <= set(e["choices"][0]), e
    assert [e["choices"][0]["finish_reason"] for e in events][-1] == "length"


# --- metrics -------------------------------------------------------------------------------------


def test_metrics_are_typed_as_vllm_declares_them(local_model_server):
    """vLLM registers its counters with prometheus_client (``Counter("vllm:prompt_tokens")``),
    whose page declares each one under its ``_total`` name: the official parser reads
    typed counter families, not untyped series."""
    from prometheus_client.parser import text_string_to_metric_families

    url = local_model_server.url
    httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    counters = ("prompt_tokens", "generation_tokens", "prefix_cache_queries", "prefix_cache_hits", "request_success")
    for name in counters:
        f = families[f"vllm:{name}"]
        assert f.type == "counter" and f.samples, (name, f)
        assert {s.name for s in f.samples} == {f"vllm:{name}_total"}
        assert all(s.labels["model_name"] == "focus-tinylm" for s in f.samples)
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
        assert families[f"vllm:{name}"].type == "gauge" and families[f"vllm:{name}"].samples
    assert not [f.name for f in families.values() if f.type == "unknown"]
    assert families["vllm:generation_tokens"].samples[0].value >= 2


# --- SGLang's meta_info ----------------------------------------------------------------------------


def test_sglang_answers_leave_out_logprob_keys_unless_asked(local_model_server):
    """SGLang's tokenizer manager adds the log-prob entries to ``meta_info`` only when
    ``return_logprob`` is set (``convert_logprob_style``); otherwise the keys are absent."""
    url = local_model_server.url
    plain = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, "sampling_seed": 1}}
    meta = httpx.post(f"{url}/generate", json=plain).json()["meta_info"]
    assert not set(LOGPROB_KEYS) & set(meta), meta
    for e in sse(httpx.post(f"{url}/generate", json={**plain, "stream": True}).text):
        assert not set(LOGPROB_KEYS) & set(e["meta_info"]), e
    asked = httpx.post(f"{url}/generate", json={**plain, "return_logprob": True}).json()["meta_info"]
    assert len(asked["output_token_logprobs"]) == asked["completion_tokens"]


def test_sglang_stream_keeps_each_requests_id(local_model_server):
    """SGLang writes ``meta_info.id`` from the request's ``rid`` on every output, the last
    one included: one id per request for the whole stream, distinct between requests."""
    url = local_model_server.url
    body = {
        "input_ids": [PROMPT, PROMPT[:-2]],
        "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 4, "sampling_seed": 2},
        "stream": True,
    }
    ids: dict[int, set[str]] = {}
    for e in sse(httpx.post(f"{url}/generate", json=body).text):
        ids.setdefault(e["index"], set()).add(e["meta_info"]["id"])
    assert sorted(ids) == [0, 1] and all(len(v) == 1 for v in ids.values()), ids
    assert ids[0] != ids[1]
    given = httpx.post(f"{url}/generate", json={**body, "input_ids": PROMPT, "rid": "mine"}).text
    assert {e["meta_info"]["id"] for e in sse(given)} == {"mine"}


# --- versions across a reload ----------------------------------------------------------------------


@pytest.mark.integration
def test_streams_running_across_a_reload_are_labelled_with_the_weights_they_used(tmp_path):
    """A request admitted before a reload decodes on the old weights to its end (vLLM's
    and SGLang's weight updates wait for or pause the requests running); every chunk of
    its stream names the old version, the last included."""
    from focus.tinylm.arch import DEFAULT_WEIGHTS

    copy = tmp_path / "same.pt"
    copy.write_bytes(DEFAULT_WEIGHTS.read_bytes())
    cmpl = {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "seed": 3, "stream": True}
    gen = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}, "stream": True}
    with LocalModelServer() as server:
        old = server.policy_version

        async def go() -> tuple[list[dict], list[dict]]:
            async with httpx.AsyncClient(base_url=server.url, timeout=300) as c:

                async def read(path: str, body: dict, started: asyncio.Event) -> list[dict]:
                    out = []
                    async with c.stream("POST", path, json=body) as resp:
                        async for line in resp.aiter_lines():
                            if line.startswith("data: {"):
                                out.append(json.loads(line[6:]))
                                started.set()
                    return out

                flags = [asyncio.Event(), asyncio.Event()]
                tasks = [
                    asyncio.create_task(read("/v1/completions", cmpl, flags[0])),
                    asyncio.create_task(read("/generate", gen, flags[1])),
                ]
                await asyncio.gather(*(f.wait() for f in flags))
                upd = await c.post("/update_weights_from_disk", json={"model_path": str(copy), "weight_version": "v2"})
                assert upd.json()["success"]
                return await tasks[0], await tasks[1]

        openai_events, sglang_events = asyncio.run(go())
        assert server.policy_version == "v2"
    assert openai_events[-1]["choices"][0]["finish_reason"] == "length"
    assert {e["policy_version"] for e in openai_events} == {old}
    assert sglang_events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert {e["meta_info"]["weight_version"] for e in sglang_events} == {old}
