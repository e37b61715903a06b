"""Test support: a fault layer around the tiny model's app (never mounted by default).

:class:`FaultLayer` is an ASGI wrapper. It records the prompt of every generation
request (``GET /debug/requests``, cleared by ``DELETE``) and injects the next queued
fault (``POST /debug/faults`` with ``{"status": 503}``, ``{"delay_s": 2.5}``,
``{"malformed": true}``, ``{"nan_logprobs": true}``, and ``"count"``), which is how
tests exercise client retries against a real socket. ``POST /debug/stall_engine`` with
``{"s": 60}`` wedges the engine: its scheduler thread blocks for that long inside one
step (a request whose completion callback does not return), while the web loop goes on
answering, ``/health`` included. The served app
(:func:`focus.tinylm.app.create_app`) knows nothing of it; ``python -m
focus.tinylm.server --debug`` (``LocalModelServer(debug=True)``) wraps the app in it.
For faults at the connection level (resets, closed sockets, short answers) see the
proxy in ``tests/fixtures/faults.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections import deque
from typing import Any

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/generate")

Scope = dict[str, Any]


class Faults:
    """Queued faults for the next generation requests."""

    def __init__(self) -> None:
        self.queue: deque[dict[str, Any]] = deque()
        self.lock = threading.Lock()

    def push(self, spec: dict[str, Any]) -> None:
        with self.lock:
            for _ in range(int(spec.get("count", 1))):
                self.queue.append(spec)

    def pop(self) -> dict[str, Any] | None:
        with self.lock:
            return self.queue.popleft() if self.queue else None


class FaultLayer:
    """ASGI app: ``/debug/...`` routes and injected faults in front of ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.faults = Faults()
        self.received: deque[dict[str, Any]] = deque(maxlen=10000)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        if path == "/debug/requests":
            if method == "DELETE":
                self.received.clear()
                await _json(send, 200, {"cleared": True})
            else:
                await _json(send, 200, {"requests": list(self.received)})
            return
        if path == "/debug/faults" and method == "POST":
            spec = json.loads(await _body(receive) or b"{}")
            self.faults.push(spec)
            await _json(send, 200, {"queued": len(self.faults.queue)})
            return
        if path == "/debug/stall_engine" and method == "POST":
            spec = json.loads(await _body(receive) or b"{}")
            _stall(self.app.state.tinylm.engine, float(spec.get("s", 3600.0)))
            await _json(send, 200, {"stalled_s": float(spec.get("s", 3600.0))})
            return
        if method != "POST" or path not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        body = await _body(receive)
        self._record(path, body)
        fault = self.faults.pop()
        replay = _replay(body, receive)
        if fault is None:
            await self.app(scope, replay, send)
            return
        if fault.get("delay_s"):
            await asyncio.sleep(float(fault["delay_s"]))
        if fault.get("status"):
            status = int(fault["status"])
            err = {"message": "injected fault", "type": "InjectedFault", "param": None, "code": status}
            await _json(send, status, {"error": err})
        elif fault.get("malformed"):
            await _raw(send, 200, b'{"choices": [')
        elif fault.get("nan_logprobs"):
            status, data = await _capture(self.app, scope, replay)
            try:
                out = json.dumps(_nan_logprobs(json.loads(data))).encode()
            except ValueError:
                out = data
            await _raw(send, status, out)
        else:
            await self.app(scope, replay, send)

    def _record(self, path: str, body: bytes) -> None:
        try:
            data = json.loads(body)
        except ValueError:
            data = {}
        ids = data.get("prompt", data.get("input_ids")) if isinstance(data, dict) else None
        self.received.append({"endpoint": path, "prompt_ids": ids, "t": time.time()})


def _stall(engine: Any, seconds: float) -> None:
    """Block ``engine``'s scheduler thread for ``seconds`` inside one step: the step that
    finishes a one-token request calls back into this, and the call does not return."""
    from focus.format import ByteCodec
    from focus.tinylm.engine import GenRequest

    def on_event(event: Any) -> None:
        if not isinstance(event, Exception):
            time.sleep(seconds)

    engine.submit(GenRequest((ByteCodec.BOS,), max_tokens=1, temperature=0.0), on_event)


def _nan_logprobs(obj: Any) -> Any:
    """Every log-prob number in an answer replaced by NaN."""
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if k in ("token_logprobs",) and isinstance(v, list):
                out[k] = [math.nan for _ in v]
            elif k == "output_token_logprobs" and isinstance(v, list):
                out[k] = [[math.nan, *t[1:]] for t in v]
            else:
                out[k] = _nan_logprobs(v)
        return out
    if isinstance(obj, list):
        return [_nan_logprobs(x) for x in obj]
    return obj


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, upstream: Any) -> Any:
    """An ASGI ``receive`` that gives the app the body already read, then passes on what
    the connection says next (``http.disconnect`` when the client goes away)."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await upstream())

    return receive


async def _capture(app: Any, scope: Scope, receive: Any) -> tuple[int, bytes]:
    status = 500
    chunks: list[bytes] = []

    async def send(msg: dict[str, Any]) -> None:
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]
        elif msg["type"] == "http.response.body":
            chunks.append(msg.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def _raw(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Any, status: int, obj: Any) -> None:
    await _raw(send, status, json.dumps(obj).encode())
