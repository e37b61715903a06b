"""Embedded model server: batched throughput idle and loaded, streams, aborts, prefix cache, conformance.

Run: ``.venv/bin/python -m benchmarks.local_model [--json local_model.json] [--rounds 3]
[--burners 2]``. One server with its defaults (``--threads`` to try another BLAS thread
count); baselines in the same run:

- throughput: 32 requests x 32 tokens one at a time vs 8 and 32 in flight (decoded
  together by continuous batching); the same requests' ids and log-probs must be
  bit-identical whatever the concurrency (counted as ``invariance_mismatches``);
- the same under load: ``--burners`` processes spinning on the CPU (``while True:
  pass``) for the whole measurement, as a training job or another server sharing the
  machine would; goal: 32 in flight at least 4x one at a time. Beside it, the same loaded
  measurement (one round) with a server using a BLAS thread per core (OpenBLAS's own
  default, and this server's before ``--threads``): what the default of one avoids;
- streams against non-streamed requests of the same shape: 64 requests x 24 tokens all in
  flight, wall time and the server's CPU seconds (its event-loop thread, which writes the
  chunks, and the rest: the engine), interleaved rounds; the streamed ids must equal the
  non-streamed ones;
- aborts: a non-streamed request of 2,000 tokens whose client hangs up once it runs (one
  at a time, then 16 together): seconds from the hang-up until the server runs nothing
  and tokens it decoded meanwhile (``/metrics``, polled); goal: 0.2 s;
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
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


SHORT = CODEC.render([]) + CODEC.encode_text("Reach 12. Total 0.")

#: A process that spins on the CPU until its parent is gone (so a killed benchmark leaks none).
BURNER = "import os\np = os.getppid()\nwhile os.getppid() == p:\n    for _ in range(10**6):\n        pass\n"


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU for the duration (another job on the machine)."""
    procs = [subprocess.Popen([sys.executable, "-c", BURNER]) for _ in range(n)]
    try:
        time.sleep(0.5 if n else 0.0)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def throughput(url: str, rounds: int = 3, concurrencies: tuple[int, ...] = (1, 8, 32)) -> dict[str, Any]:
    """Medians over ``rounds`` interleaved rounds (each concurrency once per round), so
    load from other processes on a shared machine hits every concurrency alike."""
    short = SHORT
    asyncio.run(_many(url, short, 8, 8, 8))  # warm up
    walls: dict[int, list[float]] = {c: [] for c in concurrencies}
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
    for conc in concurrencies[1:]:
        rows[f"speedup_{conc}"] = round(
            rows[f"concurrency_{conc}"]["tokens_per_s"] / rows["concurrency_1"]["tokens_per_s"], 2
        )
    rows["invariance_mismatches"] = mismatches
    rows["invariance_compared"] = rounds * len(walls) * 32
    speedups = ", ".join(f"x{rows[f'speedup_{c}']} ({c} in flight)" for c in concurrencies[1:])
    print(f"speed-up: {speedups}; mismatches {mismatches}")
    return rows


def thread_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of process ``pid``: its main thread (the server's event loop, which
    parses requests and writes answers and chunks) and all its other threads (the engine)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"loop": 0.0, "engine": 0.0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that just ended
        out["loop" if int(tid) == pid else "engine"] += (int(fields[11]) + int(fields[12])) / tick
    return out


async def _all_at_once(url: str, n: int, max_tokens: int, stream: bool) -> tuple[float, list[list[int]]]:
    """``n`` requests in flight together; their token ids (read from the chunks if ``stream``)."""
    limits = httpx.Limits(max_connections=n + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:

        async def one(i: int) -> list[int]:
            body = {"prompt": SHORT, "max_tokens": max_tokens, "seed": i, "ignore_eos": True, "return_token_ids": True}
            if not stream:
                return list((await c.post("/v1/completions", json=body)).json()["choices"][0]["token_ids"])
            ids: list[int] = []
            async with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        ids += json.loads(line[6:])["choices"][0]["token_ids"] or []
            return ids

        t0 = time.perf_counter()
        out = await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0, out


def streaming(server: LocalModelServer, rounds: int, n: int = 64, max_tokens: int = 24) -> dict[str, Any]:
    """``n`` requests x ``max_tokens`` tokens all in flight, streamed and not, interleaved."""
    assert server.pid is not None
    asyncio.run(_all_at_once(server.url, 8, 8, True))  # warm up
    runs: dict[str, list[dict[str, float]]] = {"plain": [], "stream": []}
    mismatches = 0
    for _ in range(rounds):
        answers = {}
        for kind in runs:
            before = thread_seconds(server.pid)
            wall, answers[kind] = asyncio.run(_all_at_once(server.url, n, max_tokens, kind == "stream"))
            after = thread_seconds(server.pid)
            cpu = {k: after[k] - before[k] for k in after}
            runs[kind].append({"wall_s": wall, "loop_cpu_s": cpu["loop"], "engine_cpu_s": cpu["engine"]})
        mismatches += sum(a != b for a, b in zip(answers["plain"], answers["stream"], strict=True))
    out: dict[str, Any] = {"requests": n, "max_tokens": max_tokens, "rounds": rounds, "id_mismatches": mismatches}
    for kind, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        out[kind] = {
            **{k: round(v, 3) for k, v in med.items()},
            "tokens_per_s": round(n * max_tokens / med["wall_s"], 1),
            "server_cpu_ms_per_token": round(1000 * (med["loop_cpu_s"] + med["engine_cpu_s"]) / (n * max_tokens), 3),
            "wall_s_rounds": [round(r["wall_s"], 3) for r in rs],
        }
        print(
            f"{n} requests x {max_tokens} tokens, {kind:6s}: {med['wall_s']:.2f} s, server CPU "
            f"{med['loop_cpu_s']:.2f} s loop + {med['engine_cpu_s']:.2f} s engine (median of {rounds})"
        )
    p, st = out["plain"], out["stream"]
    out["stream_wall_ratio"] = round(st["wall_s"] / p["wall_s"], 2)
    out["stream_cpu_ratio"] = round(st["server_cpu_ms_per_token"] / p["server_cpu_ms_per_token"], 2)
    print(f"streams / non-streamed: wall x{out['stream_wall_ratio']}, server CPU x{out['stream_cpu_ratio']}")
    return out


def _metrics(c: httpx.Client) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = c.get("/metrics").text
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.endswith(("running", "generation_tokens_total"))
    }


def _hang_up(url: str, c: httpx.Client, together: int, max_tokens: int) -> tuple[float, float]:
    """``together`` non-streamed requests whose clients close once they run: seconds until
    the server runs none, and tokens decoded meanwhile."""
    u = urlsplit(url)
    body = json.dumps({"prompt": SHORT, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
    socks = []
    for _ in range(together):
        sock = socket.create_connection((u.hostname, u.port))
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        socks.append(sock)
    deadline = time.monotonic() + 300
    while (m := _metrics(c))["vllm:num_requests_running"] < together and time.monotonic() < deadline:
        time.sleep(0.005)
    for sock in socks:
        sock.close()
    t0, tokens0 = time.perf_counter(), m["vllm:generation_tokens_total"]
    while (m := _metrics(c))["vllm:num_requests_running"] > 0 and time.monotonic() < deadline:
        time.sleep(0.002)
    return time.perf_counter() - t0, m["vllm:generation_tokens_total"] - tokens0


def aborts(url: str, trials: int = 5, together: int = 16, max_tokens: int = 2000) -> dict[str, Any]:
    out: dict[str, Any] = {"max_tokens": max_tokens, "together": together}
    with httpx.Client(base_url=url, timeout=60) as c:
        for key, n in (("one", 1), ("many", together)):
            runs = [_hang_up(url, c, n, max_tokens) for _ in range(trials)]
            secs, toks = [r[0] for r in runs], [r[1] for r in runs]
            out[key] = {
                "seconds_median": round(statistics.median(secs), 4),
                "seconds_max": round(max(secs), 4),
                "tokens_after_median": statistics.median(toks),
                "seconds_runs": [round(x, 4) for x in secs],
            }
            print(
                f"{n} request(s) of {max_tokens} tokens, client gone: the server stopped within "
                f"{out[key]['seconds_median']:.3f} s (median of {trials}, max {out[key]['seconds_max']:.3f} s), "
                f"{out[key]['tokens_after_median']:.0f} tokens decoded meanwhile"
            )
    return out


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
    ap.add_argument("--burners", type=int, default=2, help="CPU-spinning processes for the loaded measurement")
    ap.add_argument("--threads", type=int, help="the server's BLAS threads (default: the server's default)")
    args = ap.parse_args()
    options = {} if args.threads is None else {"threads": args.threads}
    with LocalModelServer(**options) as server:
        out: dict[str, Any] = {
            "threads": server.threads,
            "threads_is_default": args.threads is None,
            "burners": args.burners,
        }
        out["throughput"] = throughput(server.url, args.rounds)
        print(f"under load ({args.burners} CPU burners):")
        with burners(args.burners):
            out["throughput_loaded"] = throughput(server.url, args.rounds)
        out["streaming"] = streaming(server, args.rounds)
        out["aborts"] = aborts(server.url)
        out["prefix_cache"] = prefix_cache(server.url)
        out["conformance"] = conformance(server.url)
        out["robustness"] = robustness(server.url)
    cores = os.cpu_count() or 1
    print(f"under load, a server with {cores} BLAS threads (one per core):")
    with LocalModelServer(threads=cores) as other, burners(args.burners):
        out["throughput_loaded_thread_per_core"] = {"threads": cores, **throughput(other.url, 1, (1, 32))}
    args.json.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
