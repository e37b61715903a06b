"""HTTP client stacks at the engine's concurrency: CPU per request and throughput.

The question: what does one call cost the collecting process's CPU, through each stack
and through FOCUS's own client, against bare aiohttp (the goal: the client within 1.2x)? Each stack below does the same work per call - encode the
request body ``OpenAICompatPolicy`` sends (a 300-token prompt), ``POST
/v1/completions``, read, decode JSON, parse with ``parse_completion`` - with
``--concurrency`` calls in flight from one process:

* ``aiohttp``: a bare ``aiohttp.ClientSession`` (the path the client took before), with
  ``json.dumps`` and ``json.loads``: the goal's baseline.
* ``aiohttp_orjson``: the same with ``orjson`` encoding and decoding, as a careful user's
  loop would have it (FOCUS's client encodes with ``orjson`` since 2026-12-06).
* ``httpx``: ``httpx.AsyncClient`` with httpx's own transport (httpcore + h11).
* ``httpx_aiohttp_client``: ``httpx.AsyncClient(transport=httpx_aiohttp.AiohttpTransport())``.
* ``httpx_aiohttp_transport``: ``httpx.Request`` handed straight to the same transport
  (what ``focus.backends.http.HttpClient`` does).
* ``focus_client``: ``OpenAICompatPolicy.sample``, the kept stack (aiohttp called
  directly, ``focus/backends/send.py``) with everything the client adds: the prompt
  check, the retry loop, the concurrency semaphore, the hedge race of seeded requests
  (the benchmark's are seeded), the outage gate, the per-call record and its totals.

Servers, each in its own process so the figures are the client's: the simulated model
service (``focus/testing/simserver.py``; 1024 slots and a 5 ms latency, so the client,
not the server, is the limit) and the embedded tiny model (``--tinylm-requests`` calls
of one token each; its throughput is the model's, its client CPU is still the client's).

Figures per (server, concurrency, stack), over ``--repeats`` interleaved repeats (the
stack order rotates each repeat): ``cpu_ms_per_request`` (CPU time of this process /
requests; median, min, max), ``requests_per_s`` (median, min, max), and
``cpu_ratio_vs_aiohttp`` (median of the per-repeat ratios to the bare aiohttp run of
the same repeat).

    python -m benchmarks.http_client [--json out.json] [--requests 3000] [--concurrency 64,256]
        [--repeats 5] [--tinylm-requests 384] [--no-tinylm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from benchmarks.results import write_report
from focus.backends.http import HttpConfig
from focus.backends.openai_compat import OpenAICompatPolicy, parse_completion
from focus.policy import SamplingParams
from focus.testing.simserver import SimConfig, SimServerProcess

STACKS = ("aiohttp", "aiohttp_orjson", "httpx", "httpx_aiohttp_client", "httpx_aiohttp_transport", "focus_client")
#: httpx's own transport is 10-30x slower than the others; it runs a fifth of the calls
#: (its per-request figures are unaffected, the benchmark minutes shorter).
SHARE = {"httpx": 0.2}
PROMPT = [256] + [(7 * i) % 250 + 1 for i in range(299)]
JSON_HEADERS = {"Content-Type": "application/json"}


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return {
        "cores": os.cpu_count(),
        "cpu_model": model,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def _session(n: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=n, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("User-Agent",),
    )


def _sender(stack: str, url: str, n: int, max_tokens: int) -> tuple[Callable[[int], Awaitable[Any]], Any]:
    """(send one call with seed i, close) for ``stack``; made inside the running loop."""
    policy = OpenAICompatPolicy(url, config=HttpConfig(max_concurrency=n, timeout_s=300, deadline_s=None))
    params = [SamplingParams(max_tokens=max_tokens, seed=0)]

    def body(i: int) -> bytes:
        return json.dumps(policy.request_body(PROMPT, params[0].with_seed(i)), separators=(",", ":")).encode()

    target = f"{url}/v1/completions"
    if stack == "focus_client":

        async def focus_call(i: int) -> Any:
            return await policy.sample(PROMPT, params[0].with_seed(i))

        return focus_call, policy.aclose
    if stack == "aiohttp":
        session = _session(n)

        async def aiohttp_call(i: int) -> Any:
            async with session.post(target, data=body(i), headers=JSON_HEADERS) as resp:
                return parse_completion(json.loads(await resp.read()))

        return aiohttp_call, session.close
    if stack == "aiohttp_orjson":
        session = _session(n)

        async def orjson_call(i: int) -> Any:
            data = orjson.dumps(policy.request_body(PROMPT, params[0].with_seed(i)))
            async with session.post(target, data=data, headers=JSON_HEADERS) as resp:
                return parse_completion(orjson.loads(await resp.read()))

        return orjson_call, session.close
    if stack == "httpx_aiohttp_transport":
        transport = AiohttpTransport(client=lambda: _session(n))

        async def transport_call(i: int) -> Any:
            req = httpx.Request("POST", target, content=body(i), headers=JSON_HEADERS)
            resp = await transport.handle_async_request(req)
            try:
                return parse_completion(json.loads(await resp.aread()))
            finally:
                await resp.aclose()

        return transport_call, transport.aclose
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    client = httpx.AsyncClient(
        limits=limits,
        timeout=300,
        transport=AiohttpTransport(client=lambda: _session(n), limits=limits)
        if stack == "httpx_aiohttp_client"
        else None,
    )

    async def client_call(i: int) -> Any:
        resp = await client.post(target, content=body(i), headers=JSON_HEADERS)
        return parse_completion(json.loads(resp.content))

    return client_call, client.aclose


async def _run(stack: str, url: str, requests: int, n: int, max_tokens: int) -> dict[str, float]:
    call, close = _sender(stack, url, n, max_tokens)
    sem = asyncio.Semaphore(n)

    async def one(i: int) -> Any:
        async with sem:
            return await call(i)

    try:
        await asyncio.gather(*(one(i) for i in range(n)))  # open the connections
        t0, c0 = time.perf_counter(), time.process_time()
        done = await asyncio.gather(*(one(i) for i in range(requests)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        await close()
    assert len(done) == requests and all(c.token_ids for c in done)
    return {"wall_s": wall, "cpu_s": cpu}


def measure(url: str, *, requests: int, concurrency: int, repeats: int, max_tokens: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in STACKS}
    print(f"{url}: {requests} calls x {repeats} repeats, {concurrency} in flight", file=sys.stderr)
    for rep in range(repeats):
        order = STACKS[rep % len(STACKS) :] + STACKS[: rep % len(STACKS)]
        for stack in order:
            k = max(concurrency, int(requests * SHARE.get(stack, 1.0)))
            r = asyncio.run(_run(stack, url, k, concurrency, max_tokens))
            runs[stack].append({"cpu_ms": r["cpu_s"] / k * 1e3, "rate": k / r["wall_s"]})
    out: dict[str, Any] = {}
    for stack, rs in runs.items():
        cpu = [r["cpu_ms"] for r in rs]
        rate = [r["rate"] for r in rs]
        ratio = [r["cpu_ms"] / b["cpu_ms"] for r, b in zip(rs, runs["aiohttp"], strict=True)]
        out[stack] = {
            "cpu_ms_per_request": _spread(cpu, 3),
            "requests_per_s": _spread(rate, 0),
            "cpu_ratio_vs_aiohttp": round(statistics.median(ratio), 2),
        }
    return out


def _spread(xs: list[float], digits: int) -> dict[str, float]:
    return {
        "median": round(statistics.median(xs), digits),
        "min": round(min(xs), digits),
        "max": round(max(xs), digits),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the figures here (they are printed too)")
    ap.add_argument("--requests", type=int, default=3000, help="calls per run against the simulated server")
    ap.add_argument("--concurrency", default="64,256", help="calls in flight, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tinylm-requests", type=int, default=384, help="calls per run against the tiny model")
    ap.add_argument("--no-tinylm", action="store_true", help="skip the tiny model server")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]
    report: dict[str, Any] = {
        "command": "python -m benchmarks.http_client " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "load_average_before": os.getloadavg(),
        "stacks": list(STACKS),
        "simserver": {},
    }
    sim_config = SimConfig(slots=1024, latency_s=0.005, completion_tokens=8)
    report["simserver_config"] = sim_config.model_dump()
    with SimServerProcess(sim_config) as sim:
        for n in levels:
            report["simserver"][str(n)] = measure(
                sim.url, requests=args.requests, concurrency=n, repeats=args.repeats, max_tokens=8
            )
            print(f"simserver, {n} in flight: {json.dumps(report['simserver'][str(n)])}", file=sys.stderr)
    if not args.no_tinylm:
        from focus.backends.local import LocalModelServer

        server = LocalModelServer().start()
        try:
            n = levels[0]
            report["tinylm"] = {
                str(n): measure(
                    server.url,
                    requests=args.tinylm_requests,
                    concurrency=n,
                    repeats=max(1, args.repeats // 2),
                    max_tokens=1,
                )
            }
            print(f"tinylm, {n} in flight: {json.dumps(report['tinylm'][str(n)])}", file=sys.stderr)
        finally:
            server.stop()
    report["load_average_after"] = os.getloadavg()
    return write_report(report, args.json)


if __name__ == "__main__":
    main()
