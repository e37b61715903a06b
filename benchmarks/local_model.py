"""Embedded model server: throughput under concurrency, and what the prefix cache saves.

Run: ``.venv/bin/python -m benchmarks.local_model``. Baselines are measured in the same
run: sequential requests vs concurrent ones, and a cold prompt vs the same prompt again
(a continuation from a checkpoint resends its prefix, which the server's prefix cache
serves).
"""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx

from focus.backends import LocalModelServer
from focus.format import ByteCodec


async def _many(url: str, prompt: list[int], n: int, concurrency: int, max_tokens: int) -> tuple[float, int]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        async def one(i: int) -> int:
            async with sem:
                body = {
                    "prompt": prompt,
                    "max_tokens": max_tokens,
                    "seed": i,
                    "ignore_eos": True,
                    "logprobs": 0,
                    "return_token_ids": True,
                }
                r = await c.post("/v1/completions", json=body)
                return len(r.json()["choices"][0]["token_ids"])

        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(n))))
        return time.perf_counter() - t0, tokens


def main() -> None:
    codec = ByteCodec()
    short = codec.render([]) + codec.encode_text("Reach 12. Total 0.")
    with LocalModelServer(workers=2, torch_threads=1) as server:
        url = server.url
        asyncio.run(_many(url, short, 4, 4, 8))  # warm up
        for conc in (1, 8):
            wall, tokens = asyncio.run(_many(url, short, 32, conc, 32))
            print(f"32 requests x 32 tokens, concurrency {conc:2d}: {wall:6.2f} s, {tokens / wall:7.1f} tokens/s")
        with httpx.Client(base_url=url, timeout=120) as c:
            cold, warm = [], []
            for i in range(5):
                long = codec.render([]) + codec.encode_text(f"{i} " + "x" * 1500)
                for bucket in (cold, warm):
                    t0 = time.perf_counter()
                    r = c.post("/v1/completions", json={"prompt": long, "max_tokens": 1, "seed": 0}).json()
                    bucket.append(time.perf_counter() - t0)
                assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == len(long)
            print(
                f"1500-token prompt, 1 token: cold {statistics.median(cold) * 1000:6.1f} ms, "
                f"prefix-cache hit {statistics.median(warm) * 1000:6.1f} ms"
            )


if __name__ == "__main__":
    main()
