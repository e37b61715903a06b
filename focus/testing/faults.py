"""Fault injection on real loopback sockets: a model-service proxy and a cuttable TCP relay.

:class:`FaultProxy` is an HTTP/1.1 keep-alive proxy on 127.0.0.1 in front of a model
server (the tiny model server, or any OpenAI-compatible / SGLang one). On generation
requests (``/v1/completions``, ``/generate``) it injects the failures a long collection
meets: 429 and 5xx answers, answers that never come (a timeout), connections closed or
reset without an answer, a 200 whose body is not JSON, and well-formed answers carrying
fewer log-probs than tokens or NaN log-probs (:data:`KINDS`); on request, answers that
break the policy contract while keeping the format (:data:`ANSWER_KINDS`: more tokens
than ``max_tokens``, an id outside the vocabulary). Faults are queued for the next requests
(deterministic tests) or drawn at ``rate`` from a seeded generator (load runs); every
injected fault is counted by kind; queued ones may all go to one request's answers (a
server that answers one request badly on every try, others properly). The tiny model server's own ``/debug/faults`` cannot
close connections or shorten log-prob lists, and a proxy also works in front of a server
without a debug mode, which is why this exists beside it.

:class:`TcpRelay` forwards raw TCP to another loopback port (moto's S3 server in the
tests) and can be *cut* - the listening socket closed and every open connection reset -
and restored on the same port, which is an object store that is unreachable for a while
without losing the data behind it.

:class:`FaultProxyProcess` runs a proxy in a process of its own (load benchmarks).

:class:`ServerRestart` kills a model server's process mid-run (SIGKILL) and starts it
again on the same port: a crash, an OOM kill or a restart for new weights.

Both run their own asyncio loop in a daemon thread and are stopped by :meth:`stop` (or
the context manager), so a test leaves no thread listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp

from focus.testing.simserver import read_request

#: The fault kinds drawn at random by default: what a long collection meets from a
#: working service and the network (each is retried by the client).
KINDS = ("429", "500", "502", "503", "timeout", "close", "reset", "malformed", "short_logprobs", "nan_logprobs")
#: Answers that break the policy contract without breaking the format (not retried:
#: the rollout fails as a bad response): ``overlong`` appends sampled tokens past the
#: request's ``max_tokens`` (13 more, as a server that ignores the limit would);
#: ``foreign_id`` replaces the first sampled id by one outside any byte vocabulary.
ANSWER_KINDS = ("overlong", "foreign_id")
#: A transport fault drawn only when named (not in :data:`KINDS`, so seeded load runs
#: draw what they drew before): ``cut`` sends the headers of the server's answer and
#: half of its body, then closes the connection - a body cut off mid-way, as a proxy or
#: a server that dies while writing leaves it.
CUT_KINDS = ("cut",)
ALL_KINDS = KINDS + ANSWER_KINDS + CUT_KINDS
#: The id a ``foreign_id`` fault puts into an answer.
FOREIGN_ID = 70000
GENERATION_PATHS = ("/v1/completions", "/generate")


class _LoopThread:
    """An asyncio loop running in a daemon thread; ``call`` runs a coroutine on it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self._cancel_all(), timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    @staticmethod
    async def _cancel_all() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a crashed peer or a load balancer would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """HTTP proxy to ``upstream`` that injects model-service faults (see module docs).

    ``rate``: probability that a generation request gets a fault drawn uniformly from
    ``kinds`` (seeded by ``seed``). ``hang_s``: how long a ``timeout`` fault holds the
    request before closing (set it above the client's read timeout). ``latency_s``:
    extra delay on every generation request (to keep shards busy long enough to kill a
    worker in the middle of one). ``reshape``: a function that rewrites every 200 JSON
    answer to a generation request (given the answer and the request), to present the
    server behind it in another server's dialect (fields missing, extra, renamed).
    """

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.0,
        kinds: Sequence[str] = KINDS,
        seed: int = 0,
        hang_s: float = 3.0,
        latency_s: float = 0.0,
        reshape: Callable[[dict[str, Any], dict[str, Any]], Any] | None = None,
    ) -> None:
        unknown = set(kinds) - set(ALL_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {ALL_KINDS}")
        self.upstream = upstream.rstrip("/")
        self.rate = rate
        self.kinds = tuple(kinds)
        self.hang_s = hang_s
        self.latency_s = latency_s
        self.reshape = reshape
        #: The ``Retry-After`` of an injected 429, in seconds.
        self.retry_after_s = 0.0
        self._rng = random.Random(seed)
        #: Queued faults: a kind, or (kind, count) for ``count`` answers to one request.
        self._queue: deque[str | tuple[str, int]] = deque()
        #: Faults left for one request's answers, by the hash of its body.
        self._pinned: dict[int, tuple[str, int]] = {}
        self._lock = threading.Lock()
        #: Faults injected so far, by kind.
        self.injected: Counter[str] = Counter()
        #: Generation requests seen (faulted or not).
        self.requests = 0
        self.port = 0
        self._lt: _LoopThread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._session: aiohttp.ClientSession | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- control (any thread) ----

    def queue(self, kind: str, count: int = 1, *, one_request: bool = False) -> None:
        """Inject ``kind`` on the next ``count`` generation requests (before random ones);
        with ``one_request``, on the next request and the next ``count - 1`` requests
        with the same body (its retries and reruns), other requests passing meanwhile."""
        if kind not in ALL_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {ALL_KINDS}")
        with self._lock:
            self._queue.extend([(kind, count)] if one_request and count else [kind] * count)

    def pending(self) -> int:
        with self._lock:
            queued = sum(1 if isinstance(q, str) else q[1] for q in self._queue)
            return queued + sum(n for _, n in self._pinned.values())

    def _next_fault(self, body: bytes = b"") -> str | None:
        with self._lock:
            self.requests += 1
            pinned = self._pinned.pop(hash(body), None)
            if pinned is not None:
                kind: str | None = pinned[0]
                if pinned[1] > 1:
                    self._pinned[hash(body)] = (pinned[0], pinned[1] - 1)
            elif self._queue:
                queued = self._queue.popleft()
                kind = queued if isinstance(queued, str) else queued[0]
                if not isinstance(queued, str) and queued[1] > 1:
                    self._pinned[hash(body)] = (queued[0], queued[1] - 1)
            elif self.rate and self._rng.random() < self.rate:
                kind = self._rng.choice(self.kinds)
            else:
                kind = None
            if kind is not None:
                self.injected[kind] += 1
            return kind

    # ---- lifecycle ----

    def start(self) -> FaultProxy:
        self._lt = _LoopThread("fault-proxy")
        self._lt.call(self._start())
        return self

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256), timeout=aiohttp.ClientTimeout(total=120)
        )
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, limit=1 << 24)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        if self._session is not None:
            await self._session.close()

    def stop(self) -> None:
        if self._lt is None:
            return
        with contextlib.suppress(Exception):
            self._lt.call(self._stop(), timeout=10)
        self._lt.close()
        self._lt = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- serving ----

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                request = await read_request(reader)
                if request is None:
                    return
                method, path, headers, body = request
                fault = self._next_fault(body) if path.split("?")[0] in GENERATION_PATHS else None
                if fault in ("close", "reset"):
                    (_reset(writer) if fault == "reset" else writer.close())
                    return
                if fault == "timeout":
                    await asyncio.sleep(self.hang_s)
                    writer.close()
                    return
                if self.latency_s and path.split("?")[0] in GENERATION_PATHS:
                    await asyncio.sleep(self.latency_s)
                answer = await self._answer_while_connected(reader, method, path, headers, body, fault)
                if answer is None:
                    return
                status, payload, ctype, extra = answer
                head_lines = [f"HTTP/1.1 {status} X", f"Content-Type: {ctype}", f"Content-Length: {len(payload)}"]
                head_lines += [f"{k}: {v}" for k, v in extra.items()]
                if fault == "cut":  # the promised length, half the bytes, then the end
                    writer.write(("\r\n".join(head_lines) + "\r\n\r\n").encode() + payload[: len(payload) // 2])
                    await writer.drain()
                    writer.close()
                    return
                writer.write(("\r\n".join(head_lines) + "\r\n\r\n").encode() + payload)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            self._writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer_while_connected(
        self, reader: asyncio.StreamReader, *request: Any
    ) -> tuple[int, bytes, str, dict[str, str]] | None:
        """The answer; None if the client closed the connection first. The forwarded
        request is then cancelled, which closes its connection to the server, as a
        network between a client and a model server passes a client's hang-up on (the
        server aborts a request nobody waits for: hedges that lost, timed-out attempts)."""
        answer = asyncio.ensure_future(self._answer(*request))
        try:
            while not answer.done():
                if reader.at_eof():
                    return None
                await asyncio.wait((answer,), timeout=0.02)
            return answer.result()
        finally:
            answer.cancel()

    async def _answer(
        self, method: str, path: str, headers: dict[str, str], body: bytes, fault: str | None
    ) -> tuple[int, bytes, str, dict[str, str]]:
        if fault is not None and fault.isdigit():
            err = {"object": "error", "message": f"injected {fault}", "type": "InjectedFault", "code": int(fault)}
            extra = {"Retry-After": f"{self.retry_after_s:g}"} if fault == "429" else {}
            return int(fault), json.dumps(err).encode(), "application/json", extra
        if fault == "malformed":
            return 200, b'{"choices": [{"text": "', "application/json", {}
        assert self._session is not None
        fwd = {k: v for k, v in headers.items() if k in ("content-type", "authorization")}
        async with self._session.request(method, self.upstream + path, data=body, headers=fwd) as resp:
            status, payload, ctype = resp.status, await resp.read(), resp.headers.get("content-type", "")
        if fault in ("short_logprobs", "nan_logprobs") and status == 200:
            payload = json.dumps(_damage(json.loads(payload), fault)).encode()  # NaN is written as NaN
        if fault in ANSWER_KINDS and status == 200:
            payload = json.dumps(_break_contract(json.loads(payload), json.loads(body), fault)).encode()
        if self.reshape is not None and status == 200 and path.split("?")[0] in GENERATION_PATHS:
            payload = json.dumps(self.reshape(json.loads(payload), json.loads(body))).encode()
        return status, payload, ctype or "application/json", {}


def _damage(data: dict[str, Any], fault: str) -> dict[str, Any]:
    """Drop the last log-prob, or make every log-prob NaN, in a vLLM or SGLang answer."""
    lists: list[list[Any]] = []
    for ch in data.get("choices") or []:
        lp = ch.get("logprobs") or {}
        if isinstance(lp.get("token_logprobs"), list):
            lists.append(lp["token_logprobs"])
    meta = data.get("meta_info") or {}
    if isinstance(meta.get("output_token_logprobs"), list):
        lists.append(meta["output_token_logprobs"])
    for values in lists:
        if fault == "short_logprobs":
            if values:
                values.pop()
        else:
            for i, v in enumerate(values):
                values[i] = [float("nan"), *v[1:]] if isinstance(v, list) else float("nan")
    return data


def _break_contract(data: dict[str, Any], request: dict[str, Any], fault: str) -> dict[str, Any]:
    """An ``overlong`` or ``foreign_id`` answer (vLLM or SGLang layout), still well formed."""
    ch = (data.get("choices") or [{}])[0]
    lp = ch.get("logprobs") or {}
    meta = data.get("meta_info") or {}
    if isinstance(meta.get("output_token_logprobs"), list):  # SGLang
        triples = meta["output_token_logprobs"]
        if fault == "overlong":
            limit = int((request.get("sampling_params") or {}).get("max_new_tokens", 16))
            triples += [list(triples[-1]) if triples else [-1.0, 65, None]] * (limit + 13 - len(triples))
        elif triples:
            triples[0] = [triples[0][0], FOREIGN_ID, *triples[0][2:]]
        data["output_ids"] = [t[1] for t in triples]
        return data
    ids, values = ch.get("token_ids") or [], lp.get("token_logprobs") or []
    if fault == "overlong":
        extra = int(request.get("max_tokens") or 16) + 13 - len(ids)
        last = (ids[-1], values[-1]) if ids else (65, -1.0)
        ids, values = ids + [last[0]] * extra, values + [last[1]] * extra
    elif ids:
        ids = [FOREIGN_ID, *ids[1:]]
    ch["token_ids"] = ids
    lp["tokens"], lp["token_logprobs"] = [f"token_id:{t}" for t in ids], values[: len(ids)]
    return data


def _serve_proxy(conn: Any, upstream: str, options: dict[str, Any]) -> None:
    """A :class:`FaultProxyProcess`'s child: serve until told to stop, then report."""
    with FaultProxy(upstream, **options) as proxy:
        conn.send(proxy.url)
        conn.recv()  # "stop", or EOF when the parent is gone
        conn.send({"requests": proxy.requests, "injected": dict(proxy.injected)})


class FaultProxyProcess:
    """A :class:`FaultProxy` in a process of its own (same arguments, random faults only).

    In a load benchmark the proxy stands for the network and the model service, so its
    CPU should not be charged to the collecting process: in-process, every request it
    forwards takes the collector's interpreter lock, and the faulty run's extra requests
    slow the collection as much as the faults themselves do. ``requests`` and
    ``injected`` are filled in when it stops.
    """

    def __init__(self, upstream: str, *, startup_timeout_s: float = 30.0, **options: Any) -> None:
        self.upstream, self.options, self.startup_timeout_s = upstream, options, startup_timeout_s
        self.url = ""
        self.requests = 0
        self.injected: Counter[str] = Counter()
        self._proc: Any = None
        self._conn: Any = None

    def start(self) -> FaultProxyProcess:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_proxy, args=(child, self.upstream, self.options), daemon=True)
        self._proc.start()
        child.close()
        if not self._conn.poll(self.startup_timeout_s):
            self._proc.kill()
            raise RuntimeError(f"the fault proxy did not start within {self.startup_timeout_s:g} s")
        try:
            self.url = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"the fault proxy process exited at start (code {self._proc.exitcode})") from None
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(OSError, EOFError):
            self._conn.send("stop")
            if self._conn.poll(30):
                report = self._conn.recv()
                self.requests, self.injected = report["requests"], Counter(report["injected"])
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
        self._conn.close()
        self._proc = None

    def __enter__(self) -> FaultProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def served_requests(url: str) -> int:
    """Generation requests a model server has answered: vLLM's ``vllm:request_success``
    counter on ``/metrics`` (vLLM, the embedded server), else ``requests`` on ``/stats``
    (the simulated server)."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=5.0, trust_env=False).text
    lines = [line for line in text.splitlines() if line.startswith("vllm:request_success")]
    if lines:
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in lines))
    return int(httpx.get(f"{url}/stats", timeout=5.0, trust_env=False).json()["requests"])


class ServerRestart:
    """Kills a model server's process mid-run and starts it again on the same port.

    A thread watches the server (:func:`served_requests`, every ``poll_s``); once it has
    answered ``after_requests`` generation requests it kills the process with SIGKILL (a
    crash, an OOM kill: no connection is closed politely), waits ``down_s`` seconds and
    starts the server again (``server.start()``: the same arguments and port; the server
    must have been started with a fixed port or keep the one it was given, as
    :class:`~focus.backends.LocalModelServer` and
    :class:`~focus.testing.simserver.SimServerProcess` do). ``down_s=None`` leaves it
    down until :meth:`restart`. ``killed_at`` and ``up_at`` are monotonic times.
    """

    def __init__(self, server: Any, *, after_requests: int, down_s: float | None, poll_s: float = 0.02) -> None:
        self.server, self.after_requests, self.down_s, self.poll_s = server, after_requests, down_s, poll_s
        self.killed_at: float | None = None
        self.up_at: float | None = None
        self.requests_at_kill = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="server-restart", daemon=True)

    def start(self) -> ServerRestart:
        self._thread.start()
        return self

    def _run(self) -> None:
        import os
        import signal
        import time

        try:
            while not self._stop.is_set():
                served = served_requests(self.server.url)
                if served >= self.after_requests:
                    break
                time.sleep(self.poll_s)
            else:
                return
            self.requests_at_kill = served
            os.kill(self.server.proc.pid, signal.SIGKILL)
            self.server.proc.wait()
            self.killed_at = time.monotonic()
            self.server.stop()  # its folder and log; the process is gone already
            if self.down_s is not None and not self._stop.wait(self.down_s):
                self.restart()
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.error = e

    def restart(self) -> None:
        """Start the server again on its port (if it is down)."""
        import time

        if self.server.proc is None:
            self.server.start()
            self.up_at = time.monotonic()

    @property
    def down_for_s(self) -> float | None:
        """Seconds from the kill to the restarted server's first answer to /health."""
        return None if self.killed_at is None or self.up_at is None else self.up_at - self.killed_at

    def stop(self) -> None:
        """Stop watching (the server is left as it is); raise what the thread raised."""
        self._stop.set()
        self._thread.join(timeout=60)
        if self.error is not None:
            raise self.error

    def __enter__(self) -> ServerRestart:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TcpRelay:
    """Raw TCP relay on 127.0.0.1 to ``target_port``; :meth:`cut` and :meth:`restore` it."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.connections = 0
        self._lt: _LoopThread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._server is None

    def start(self) -> TcpRelay:
        self._lt = _LoopThread("tcp-relay")
        self._lt.call(self._listen())
        return self

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for w in list(self._writers):
            _reset(w)
        self._writers.clear()

    def cut(self) -> None:
        """Refuse new connections and reset every open one (the store is unreachable)."""
        assert self._lt is not None
        self._lt.call(self._cut())

    def restore(self) -> None:
        """Listen again on the same port."""
        assert self._lt is not None
        self._lt.call(self._listen())

    def stop(self) -> None:
        if self._lt is None:
            return
        with contextlib.suppress(Exception):
            self._lt.call(self._cut(), timeout=10)
        self._lt.close()
        self._lt = None

    def __enter__(self) -> TcpRelay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _reset(writer)
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(1 << 16):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))
