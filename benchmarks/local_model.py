"""Embedded model server: batched throughput, prefix-cache speed-up, conformance, robustness.

Run: ``.venv/bin/python -m benchmarks.local_model [--json local_model.json] [--rounds 3]``. One server
with its defaults; baselines in the same run:

- throughput: 32 requests x 32 tokens one at a time vs 8 and 32 in flight (decoded
  together by continuous batching); the same requests' ids and log-probs must be
  bit-identical whatever the concurrency (counted as ``invariance_mismatches``);
- prefix cache: a 1,500-token prompt cold vs the same prompt again (a hit);
- conformance: every request shape (completions with top-k log-probs, echo, n > 1,
  prompt batches, stop ids and strings, prompt log-probs, streaming; chat completions
  plain and streaming; models, tokenize) through the official ``openai`` SDK, each
  answer also validated with the vLLM protocol models of :mod:`focus.tinylm.protocol`,
  and SGLang's ``/generate`` through its models; failures counted;
- robustness: malformed requests must each get a 4xx in vLLM's error layout, and the
  server must still answer afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from focus.backends import LocalModelServer
from focus.format import ByteCodec
from focus.tinylm import protocol as P
from focus.tinylm.sglang_protocol import GenerateResponse

CODEC = ByteCodec()


async def _many(url: str, prompt: list[int], n: int, concurrency: int, max_tokens: int) -> tuple[float, list[Any]]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as c:

        async def one(i: int) -> Any:
            async with sem:
                body = {
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "seed": i,
                    "ignore_eos": True,
                    "logprobs": 0,
                    "return_token_ids": True,
                }
                ch = (await c.post("/v1/completions", json=body)).json()["choices"][0]
                return ch["token_ids"], ch["logprobs"]["token_logprobs"]

        t0 = time.perf_counter()
        out = await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0, out


def throughput(url: str, rounds: int = 3) -> dict[str, Any]:
    """Medians over ``rounds`` interleaved rounds (1, 8, 32 in flight each round), so load
    from other processes on a shared machine hits every concurrency alike."""
    short = CODEC.render([]) + CODEC.encode_text("Reach 12. Total 0.")
    asyncio.run(_many(url, short, 8, 8, 8))  # warm up
    walls: dict[int, list[float]] = {1: [], 8: [], 32: []}
    base = None
    mismatches = 0
    tokens = 0
    for _ in range(rounds):
        for conc in walls:
            wall, out = asyncio.run(_many(url, short, 32, conc, 32))
            tokens = sum(len(ids) for ids, _ in out)
            walls[conc].append(wall)
            if base is None:
                base = out
            mismatches += sum(a != b for a, b in zip(base, out, strict=True))
    rows: dict[str, Any] = {"rounds": rounds}
    for conc, ws in walls.items():
        wall = statistics.median(ws)
        rows[f"concurrency_{conc}"] = {
            "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1),
            "wall_s_rounds": [round(w, 3) for w in ws],
        }
        print(f"32 requests x 32 tokens, {conc:2d} in flight: {wall:6.2f} s, {tokens / wall:7.1f} tokens/s (median)")
    for conc in (8, 32):
        rows[f"speedup_{conc}"] = round(
            rows[f"concurrency_{conc}"]["tokens_per_s"] / rows["concurrency_1"]["tokens_per_s"], 2
        )
    rows["invariance_mismatches"] = mismatches
    rows["invariance_compared"] = rounds * len(walls) * 32
    print(f"speed-up: x{rows['speedup_8']} (8 in flight), x{rows['speedup_32']} (32); mismatches {mismatches}")
    return rows


def prefix_cache(url: str) -> dict[str, Any]:
    cold, warm = [], []
    with httpx.Client(base_url=url, timeout=300) as c:
        for i in range(5):
            long = CODEC.render([]) + CODEC.encode_text(f"{i} " + "x" * 1500)
            for bucket in (cold, warm):
                t0 = time.perf_counter()
                r = c.post("/v1/completions", json={"prompt": long, "max_tokens": 1, "seed": 0}).json()
                bucket.append(time.perf_counter() - t0)
            assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == len(long)
    out = {
        "prompt_tokens": len(long),
        "cold_ms": statistics.median(cold) * 1000,
        "hit_ms": statistics.median(warm) * 1000,
        "cold_ms_runs": [round(x * 1000, 2) for x in cold],
        "hit_ms_runs": [round(x * 1000, 2) for x in warm],
    }
    out["speedup"] = round(out["cold_ms"] / out["hit_ms"], 1)
    print(
        f"{len(long)}-token prompt, 1 token: cold {out['cold_ms']:.1f} ms, hit {out['hit_ms']:.1f} ms (x{out['speedup']})"
    )
    return out


def conformance(url: str) -> dict[str, Any]:
    import openai

    prompt = CODEC.render([]) + CODEC.encode_text("Reach 12. Total 0.")
    msgs = [{"role": "user", "content": "Reach 12. Total 0."}]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    m = "focus-tinylm"
    shapes: dict[str, Callable[[], None]] = {
        "completion ids + top-3 log-probs": lambda: _cmpl(
            client.completions.create(model=m, prompt=prompt, max_tokens=5, logprobs=3, seed=1), 5
        ),
        "completion text prompt": lambda: _cmpl(
            client.completions.create(model=m, prompt="Total 3.", max_tokens=3), None
        ),
        "echo + log-probs": lambda: _cmpl(
            client.completions.create(model=m, prompt=prompt, max_tokens=2, logprobs=1, echo=True), None
        ),
        "n = 3": lambda: _n(client.completions.create(model=m, prompt=prompt, max_tokens=2, n=3, seed=2), 3),
        "prompt batch": lambda: _n(client.completions.create(model=m, prompt=[prompt, prompt[:4]], max_tokens=2), 2),
        "stop strings + stop ids": lambda: _cmpl(
            client.completions.create(
                model=m, prompt=prompt, max_tokens=8, stop=["1"], extra_body={"stop_token_ids": [50]}
            ),
            None,
        ),
        "prompt_logprobs + token ids": lambda: _cmpl(
            client.completions.create(
                model=m, prompt=prompt, max_tokens=2, extra_body={"prompt_logprobs": 2, "return_token_ids": True}
            ),
            None,
        ),
        "greedy": lambda: _cmpl(client.completions.create(model=m, prompt=prompt, max_tokens=3, temperature=0), None),
        "streaming + usage": lambda: _stream(
            client.completions.create(
                model=m, prompt=prompt, max_tokens=4, stream=True, stream_options={"include_usage": True}
            ),
            P.CompletionStreamResponse,
        ),
        "chat": lambda: _validate(
            client.chat.completions.create(model=m, messages=msgs, max_tokens=4, logprobs=True, top_logprobs=2),
            P.ChatCompletionResponse,
        ),
        "chat streaming": lambda: _stream(
            client.chat.completions.create(model=m, messages=msgs, max_tokens=4, stream=True),
            P.ChatCompletionStreamResponse,
        ),
        "models": lambda: _validate(client.models.list(), P.ModelList),
        "tokenize": lambda: P.TokenizeResponse.model_validate(
            httpx.post(f"{url}/tokenize", json={"prompt": "hi"}).json()
        ),
        "sglang generate batch + logprobs": lambda: [
            GenerateResponse.model_validate(x)
            for x in httpx.post(
                f"{url}/generate",
                json={
                    "input_ids": [prompt, prompt[:5]],
                    "sampling_params": {"max_new_tokens": 3, "n": 2},
                    "return_logprob": True,
                    "logprob_start_len": 0,
                    "top_logprobs_num": 2,
                },
            ).json()
        ],
    }
    failures = {}
    for name, fn in shapes.items():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - counted and reported
            failures[name] = f"{type(e).__name__}: {e}"
    client.close()
    print(f"conformance: {len(shapes) - len(failures)}/{len(shapes)} request shapes ok {failures or ''}")
    return {"shapes": len(shapes), "failures": len(failures), "failed": failures}


def _validate(obj: Any, model: Any) -> None:
    model.model_validate(obj.model_dump())


def _cmpl(r: Any, n_tokens: int | None) -> None:
    _validate(r, P.CompletionResponse)
    lp = r.choices[0].logprobs
    if lp is not None:
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs)
    if n_tokens is not None:
        assert r.usage.completion_tokens == n_tokens or r.choices[0].finish_reason == "stop"


def _n(r: Any, n: int) -> None:
    _validate(r, P.CompletionResponse)
    assert [c.index for c in r.choices] == list(range(n))


def _stream(chunks: Any, model: Any) -> None:
    got = [c.model_dump() for c in chunks]
    assert got
    for c in got:
        model.model_validate(c)


def robustness(url: str) -> dict[str, Any]:
    prompt = CODEC.render([]) + CODEC.encode_text("Total 1.")
    bad: list[tuple[str, Any]] = [
        ("/v1/completions", {"prompt": prompt, "max_tokens": "abc"}),
        ("/v1/completions", {"prompt": prompt, "temperature": "hot"}),
        ("/v1/completions", {"prompt": prompt, "seed": 1.5}),
        ("/v1/completions", {"prompt": prompt, "seed": 2**64}),
        ("/v1/completions", {"prompt": prompt, "n": "x"}),
        ("/v1/completions", {"prompt": prompt, "max_tokens": 0}),
        ("/v1/completions", {"prompt": prompt, "max_tokens": 1.7}),
        ("/v1/completions", {"prompt": prompt, "ignore_eos": "maybe"}),
        ("/v1/completions", {"prompt": prompt, "logprobs": -5}),
        ("/v1/completions", {"prompt": prompt, "model": "other"}),
        ("/v1/completions", {"prompt": [1, 99999]}),
        ("/v1/completions", {"prompt": [[]]}),
        ("/v1/completions", {"prompt": prompt, "max_tokens": 10**6}),
        ("/v1/completions", b"{not json"),
        ("/v1/completions", b"[]"),
        ("/v1/chat/completions", {"messages": [{"role": "alien", "content": "x"}]}),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}),
        ("/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": "abc"}}),
        ("/generate", {"input_ids": prompt, "sampling_params": {"temperature": -1}}),
        ("/generate", {"input_ids": prompt, "sampling_params": {"unknown_param": 1}}),
        ("/generate", {"input_ids": [[1, 2], []], "sampling_params": {}}),
        ("/generate", {"text": None}),
        ("/detokenize", {"tokens": ["a"]}),
        ("/update_weights_from_disk", {"model_path": "/nonexistent.pt"}),
    ]
    answered_4xx = 0
    with httpx.Client(base_url=url, timeout=60) as c:
        for path, body in bad:
            if isinstance(body, bytes):
                r = c.post(path, content=body, headers={"content-type": "application/json"})
            else:
                r = c.post(path, json=body)
            ok = 400 <= r.status_code < 500
            if ok and path != "/update_weights_from_disk":
                P.ErrorResponse.model_validate(r.json())
            answered_4xx += ok
            if not ok:
                print(f"  not 4xx: {path} {body!r} -> {r.status_code} {r.text[:200]}")
        alive = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2}).status_code == 200
    print(f"robustness: {answered_4xx}/{len(bad)} malformed requests answered 4xx; still serving: {alive}")
    return {"malformed": len(bad), "answered_4xx": answered_4xx, "still_serving": alive}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, default=Path("local_model.json"))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved throughput rounds (medians reported)")
    args = ap.parse_args()
    with LocalModelServer() as server:
        out = {
            "throughput": throughput(server.url, args.rounds),
            "prefix_cache": prefix_cache(server.url),
            "conformance": conformance(server.url),
            "robustness": robustness(server.url),
        }
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
