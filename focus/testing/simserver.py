"""A simulated model service for measuring the rollout engine (benchmark only).

It answers the subset of vLLM's OpenAI-compatible ``POST /v1/completions`` that
``focus.backends.OpenAICompatPolicy`` sends and that ``focus.tinylm.server`` serves
(token-id prompts, ``logprobs``, ``return_token_ids``, ``return_tokens_as_token_ids``,
``stop_token_ids``, ``seed``, ``usage.prompt_tokens_details.cached_tokens``), but
instead of running a model it *waits*: each call holds one of ``slots`` serving slots
for ``latency_s + per_token_s * generated tokens``. Requests beyond the slots queue in
arrival order, as in a real server whose batch is full. That makes the model service
an exact, cheap bottleneck, so what the benchmark measures is the engine.

A prefix cache (a token trie over every prompt + completion seen, like vLLM's automatic
prefix caching or SGLang's radix cache) reports how many prompt tokens a real server
would have served from cache. It is what shows whether continuations resend the exact
prefix of their checkpoint.

The server is a small HTTP/1.1 keep-alive server on raw asyncio streams rather than
FastAPI: the benchmark runs server and engine on the same cores, and the server's own
CPU time should be small next to the engine's. Each request is logged with its seed,
so the benchmark can find the first call of every continuation afterwards
(``GET /requests``); ``GET /stats`` gives totals including busy slot-seconds.

Sampled tokens are deterministic in the request's seed: ``completion_tokens - 1``
ASCII digits 1-9, then the first stop id (finish ``stop``), or only digits when no stop
id was asked (finish ``length``). Digits make every answer a valid move in
``focus.toy.ReachTarget``.

Run: ``python -m focus.testing.simserver --slots 128 --latency-s 0.2 [--port-file F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from focus.backends.local import stop_process
from focus.backends.routing import PrefixBlocks
from focus.spawn import spawn

DIGITS = tuple(range(ord("1"), ord("9") + 1))
DIGIT_LOGPROB = -math.log(len(DIGITS))
STOP_LOGPROB = -0.05


class SimConfig(BaseModel):
    """Serving capacity and timing of the simulated model service."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Requests served at once; more queue (first come, first served).
    slots: int = Field(128, ge=1)
    #: Seconds a call holds its slot, plus ``per_token_s`` per generated token.
    latency_s: float = Field(0.2, ge=0.0)
    per_token_s: float = Field(0.0, ge=0.0)
    #: Tokens generated per call (the last is the stop id when one is asked).
    completion_tokens: int = Field(3, ge=1)
    #: Token ids the prefix cache keeps before it is flushed (0: no cache).
    cache_capacity_tokens: int = Field(5_000_000, ge=0)
    #: 0: the cache is an exact token trie, flushed whole when full; N > 0: it keeps
    #: blocks of N tokens and evicts the least recently used, as vLLM's automatic prefix
    #: caching does (a partial last block is not kept; cached counts are whole blocks).
    cache_block_tokens: int = Field(0, ge=0)
    #: Seconds a call holds its slot per prompt token not served from the cache (the
    #: prefill a real server computes): what a prefix-cache miss costs.
    prefill_s_per_token: float = Field(0.0, ge=0.0)
    #: The weights version the server names (``policy_version`` in answers and on
    #: ``GET /v1/models``); None: answers name only the model, as before.
    version: str | None = None
    #: Where the weights were loaded from, as vLLM's ``/v1/models`` card says (``root``);
    #: None: the card has none.
    root: str | None = None
    vocab_size: int = Field(263, ge=len(DIGITS))
    #: As vLLM's ``--api-key``: a ``/v1`` request without ``Authorization: Bearer <key>``
    #: is answered 401 ``{"error": "Unauthorized"}``. None: no key is asked.
    api_key: str | None = None


class PrefixCache:
    """A token trie of sequences seen; ``match`` is the longest cached prefix of a prompt.

    Nodes are plain dicts (token id -> child), which is compact enough for a few million
    tokens. When the stored tokens pass ``capacity`` the whole trie is dropped (counted in
    ``flushes``): cruder than LRU, but it never overstates the hit ratio.
    """

    def __init__(self, capacity: int = 5_000_000) -> None:
        self.capacity = capacity
        self.root: dict[int, Any] = {}
        self.size = 0
        self.flushes = 0

    def shape(self) -> tuple[int, ...]:
        """The arguments that make an empty cache like this one."""
        return (self.capacity,)

    def match(self, ids: Sequence[int]) -> int:
        node = self.root
        n = 0
        for t in ids:
            child = node.get(t)
            if child is None:
                break
            node = child
            n += 1
        return n

    def insert(self, ids: Sequence[int]) -> None:
        if self.capacity <= 0:
            return
        node = self.root
        for t in ids:
            child = node.get(t)
            if child is None:
                child = node[t] = {}
                self.size += 1
            node = child
        if self.size > self.capacity:
            self.root, self.size = {}, 0
            self.flushes += 1


def sample(
    prompt_ids: Sequence[int], n: int, max_tokens: int, stop_ids: Sequence[int], seed: int | None
) -> tuple[list[int], list[float], str]:
    """Deterministic stand-in for sampling: ids, their log-probs and the finish reason."""
    rng = random.Random(seed if seed is not None else hash(tuple(prompt_ids[-16:])))
    body = n - 1 if stop_ids else n
    ids = [DIGITS[rng.randrange(len(DIGITS))] for _ in range(min(body, max_tokens))]
    lps = [DIGIT_LOGPROB] * len(ids)
    if stop_ids and len(ids) < max_tokens:
        ids.append(int(stop_ids[0]))
        lps.append(STOP_LOGPROB)
        return ids, lps, "stop"
    return ids, lps, "length"


class BlockCache:
    """The server's prefix cache in blocks (:class:`focus.backends.routing.PrefixBlocks`),
    with :class:`PrefixCache`'s interface: ``match`` counts cached tokens (whole blocks)."""

    def __init__(self, capacity_tokens: int, block: int) -> None:
        self.blocks = PrefixBlocks(capacity_tokens // block, block)
        self.flushes = 0

    def shape(self) -> tuple[int, ...]:
        return (self.blocks.capacity * self.blocks.block, self.blocks.block)

    @property
    def size(self) -> int:
        return len(self.blocks) * self.blocks.block

    def match(self, ids: Sequence[int]) -> int:
        return self.blocks.match(self.blocks.keys(ids)) * self.blocks.block

    def insert(self, ids: Sequence[int]) -> None:
        self.blocks.insert(self.blocks.keys(ids))


class BadRequest(ValueError):
    pass


class SimServer:
    """State of one simulated server: slots, cache, request log and counters."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.cache: PrefixCache | BlockCache = (
            BlockCache(config.cache_capacity_tokens, config.cache_block_tokens)
            if config.cache_block_tokens
            else PrefixCache(config.cache_capacity_tokens)
        )
        self.slots = asyncio.Semaphore(config.slots)
        self.in_flight = 0
        self.waiting = 0
        self.t_start = time.monotonic()
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.busy_slot_s = 0.0
        self.max_in_flight = 0
        self.max_waiting = 0
        #: One row per request: arrival, slot acquired, done (s since start), seed, prompt, cached, completion tokens.
        self.log: list[tuple[float, float, float, int | None, int, int, int]] = []

    def stats(self) -> dict[str, Any]:
        return {
            "now_s": time.monotonic() - self.t_start,
            "cpu_s": time.process_time(),
            "slots": self.config.slots,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "busy_slot_s": self.busy_slot_s,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "max_in_flight": self.max_in_flight,
            "max_waiting": self.max_waiting,
            "cache_tokens": self.cache.size,
            "cache_flushes": self.cache.flushes,
            "config": self.config.model_dump(),
        }

    async def complete(self, data: dict[str, Any]) -> dict[str, Any]:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0] if len(prompt) == 1 else None
        if not isinstance(prompt, list) or not prompt or not all(type(t) is int for t in prompt):
            raise BadRequest("'prompt' must be a non-empty list of token ids")
        bad = next((t for t in prompt if not 0 <= t < self.config.vocab_size), None)
        if bad is not None:
            raise BadRequest(f"prompt token id {bad} is outside the vocabulary [0, {self.config.vocab_size})")
        n = data.get("n", 1)
        if type(n) is not int or n < 1:
            raise BadRequest(f"n must be a positive integer, got {n!r}")
        max_tokens = int(data.get("max_tokens") or 16)
        stop_ids = data.get("stop_token_ids") or []
        seed = data.get("seed")
        # n samples as vLLM draws them: sample j with seed + j, each in its own slot
        if n == 1:
            samples = [await self._sample(prompt, max_tokens, stop_ids, seed, 0)]
        else:
            samples = await asyncio.gather(
                *(self._sample(prompt, max_tokens, stop_ids, None if seed is None else seed + j, j) for j in range(n))
            )
        self.requests += 1
        choices = []
        for j, (ids, lps, finish, _) in enumerate(samples):
            choice: dict[str, Any] = {
                "index": j,
                "text": bytes(t for t in ids if t < 256).decode(errors="replace"),
                "finish_reason": finish,
                "logprobs": {"tokens": [f"token_id:{t}" for t in ids], "token_logprobs": lps},
            }
            if data.get("return_token_ids"):
                choice["token_ids"] = ids
            choices.append(choice)
        completion_tokens = sum(len(c[0]) for c in samples)
        cached = samples[0][3]
        named = {"policy_version": self.config.version} if self.config.version else {}
        return {
            "id": f"sim-{self.requests}",
            "object": "text_completion",
            "model": str(data.get("model", "sim")),
            **named,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt) + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    async def _sample(
        self, prompt: list[int], max_tokens: int, stop_ids: list[int], seed: int | None, j: int
    ) -> tuple[list[int], list[float], str, int]:
        """Sample ``j`` of a request in a slot of its own; sample 0 reads the prefix cache,
        the others share its prefill (as vLLM's ``n`` samples share the prompt's KV)."""
        arrived = time.monotonic()
        self.waiting += 1
        self.max_waiting = max(self.max_waiting, self.waiting)
        async with self.slots:
            self.waiting -= 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            acquired = time.monotonic()
            try:
                cfg = self.config
                cached = self.cache.match(prompt) if j == 0 else len(prompt)
                ids, lps, finish = sample(prompt, cfg.completion_tokens, max_tokens, stop_ids, seed)
                prefill = cfg.prefill_s_per_token * (len(prompt) - cached)
                await asyncio.sleep(cfg.latency_s + prefill + cfg.per_token_s * len(ids))
                self.cache.insert(prompt + ids)
            finally:
                self.in_flight -= 1
                done = time.monotonic()
                self.busy_slot_s += done - acquired
        if j == 0:
            self.prompt_tokens += len(prompt)
            self.cached_tokens += cached
        self.completion_tokens += len(ids)
        t0 = self.t_start
        self.log.append((arrived - t0, acquired - t0, done - t0, seed, len(prompt), cached, len(ids)))
        return ids, lps, finish, cached

    async def route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        path = path.split("?", 1)[0]
        if method == "POST" and path == "/v1/completions":
            try:
                data = json.loads(body)
            except ValueError as e:
                return 400, _error(f"request body is not valid JSON: {e}")
            if not isinstance(data, dict):
                return 400, _error("request body must be a JSON object")
            try:
                return 200, await self.complete(data)
            except (BadRequest, TypeError, ValueError) as e:
                return 400, _error(str(e))
        if method == "GET" and path == "/health":
            return 200, {"status": "ok"}
        if method == "GET" and path == "/v1/models":
            card: dict[str, Any] = {"id": "sim", "object": "model", "vocab_size": self.config.vocab_size}
            if self.config.version:
                card["policy_version"] = self.config.version
            if self.config.root:
                card["root"] = self.config.root
            return 200, {"object": "list", "data": [card]}
        if method == "GET" and path == "/stats":
            return 200, self.stats()
        if method == "GET" and path == "/requests":
            return 200, {
                "columns": ["arrived", "acquired", "done", "seed", "prompt", "cached", "completion"],
                "rows": self.log,
            }
        if method == "POST" and path == "/reset":
            self.reset()
            return 200, {"reset": True}
        if method == "POST" and path == "/flush_cache":  # SGLang's name for it
            self.cache = type(self.cache)(*self.cache.shape())
            return 200, {"success": True}
        return 404, _error(f"no route {method} {path}", 404)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """HTTP/1.1 with keep-alive and Content-Length bodies (what httpx sends)."""
        try:
            while True:
                request = await read_request(reader)
                if request is None:
                    return
                method, path, headers, body = request
                close = headers.get("connection", "").lower() == "close"
                if (
                    self.config.api_key
                    and path.startswith("/v1")
                    and (headers.get("authorization") != f"Bearer {self.config.api_key}")
                ):
                    status, payload = 401, {"error": "Unauthorized"}
                else:
                    status, payload = await self.route(method, path, body)
                out = json.dumps(payload, separators=(",", ":")).encode()
                reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}.get(status, "Error")
                writer.write(
                    f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(out)}\r\n\r\n".encode()
                    + out
                )
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            with contextlib.suppress(Exception):
                writer.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str], bytes] | None:
    """One HTTP/1.1 request off a keep-alive connection: method, path, headers (names in
    lower case) and its Content-Length body; None when the client has gone."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    return method, path, headers, await reader.readexactly(length) if length else b""


def _error(message: str, code: int = 400) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": "BadRequestError", "code": code}


def _watch_parent(pid: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)


async def serve(config: SimConfig, host: str, port: int, port_file: Path | None) -> None:
    sim = SimServer(config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = await asyncio.start_server(sim.handle, sock=sock, backlog=4096)
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        tmp.replace(port_file)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Simulated OpenAI-compatible completions server (benchmark only).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", type=Path)
    ap.add_argument("--parent-pid", type=int)
    ap.add_argument("--config", default="{}", help="SimConfig as JSON")
    args = ap.parse_args(argv)
    config = SimConfig.model_validate_json(args.config)
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    asyncio.run(serve(config, args.host, args.port, args.port_file))


class SimServerProcess:
    """Runs the simulated server in its own process on 127.0.0.1 (so its CPU is not the
    engine's); stops it by PID on exit. The server also exits when its parent dies.
    ``port``: 0 picks a free one; a server stopped and started again keeps its port."""

    def __init__(self, config: SimConfig | None = None, startup_timeout_s: float = 20.0, port: int = 0) -> None:
        self.config = config or SimConfig()
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._tmp: Path | None = None
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SimServerProcess:
        import httpx

        self._tmp = tmp = Path(tempfile.mkdtemp(prefix="focus-simserver-"))
        port_file = tmp / "port"
        cmd = [
            sys.executable,
            "-m",
            "focus.testing.simserver",
            "--port-file",
            str(port_file),
            "--port",
            str(self.port),
            "--parent-pid",
            str(os.getpid()),
            "--config",
            self.config.model_dump_json(),
        ]
        self._log = open(tmp / "log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = spawn(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + self.startup_timeout_s
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (tmp / "log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"simulated server did not start: {log}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        httpx.get(f"{self.url}/health", timeout=5.0, trust_env=False).raise_for_status()
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def stats(self) -> dict[str, Any]:
        import httpx

        return dict(httpx.get(f"{self.url}/stats", timeout=10.0, trust_env=False).json())

    def requests(self) -> list[list[Any]]:
        import httpx

        return list(httpx.get(f"{self.url}/requests", timeout=60.0, trust_env=False).json()["rows"])

    def reset(self) -> None:
        """Zero the counters and the request log (the cache stays)."""
        import httpx

        httpx.post(f"{self.url}/reset", timeout=10.0, trust_env=False).raise_for_status()

    def flush_cache(self) -> None:
        """Empty the prefix cache."""
        import httpx

        httpx.post(f"{self.url}/flush_cache", timeout=10.0, trust_env=False).raise_for_status()

    def __enter__(self) -> SimServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    main()
