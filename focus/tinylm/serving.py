"""What every route shares: the engine bridge, request parsing, errors and token text.

Routes run on the asyncio loop; the engine runs on its own thread. :func:`run` submits
engine requests and yields their events on the loop (each token for streaming
requests, then the result); leaving early cancels them. A client that disconnects
aborts its requests at the engine's next step, as vLLM and SGLang abort theirs: a
stream notices when its next chunk cannot be sent, a non-streamed request because
:func:`results` watches the connection while it waits (a client's timed-out attempt or
a hedged copy that lost must not keep the engine decoding).
Bodies are parsed with the protocol models; any failure is answered in vLLM's error
layout (``{"error": {"message", "type", "param", "code"}}``). Routes are plain Starlette
(:class:`Routes`): fastapi's import alone took 0.15 s of the server's start, on the
critical path of ``focus collect``, for features these routes do not use.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from focus.format import ByteCodec
from focus.tinylm.engine import Engine, EngineError, GenRequest, GenResult, Handle, TokenEvent
from focus.tinylm.protocol import ErrorInfo, ErrorResponse, RequestError

M = TypeVar("M", bound=BaseModel)

MODEL_NAME = "focus-tinylm"
#: Seconds one engine step may run before ``/health`` answers 503 (``--engine-stall-s``;
#: :func:`focus.tinylm.app.create_app`). A step is milliseconds on this model.
ENGINE_STALL_S = 30.0
_SPECIAL = {
    ByteCodec.BOS: "<bos>",
    ByteCodec.EOT: "<eot>",
    ByteCodec.SYSTEM: "<system>",
    ByteCodec.USER: "<user>",
    ByteCodec.ASSISTANT: "<assistant>",
    ByteCodec.TOOL: "<tool>",
    ByteCodec.PAD: "<pad>",
}


class Inbox:
    """Engine events handed to the event loop in bursts. The engine thread delivers one
    event per running request per step; waking the loop for each (a system call, and the
    interpreter lock passed back and forth) cost a stream of 64 requests more than their
    tokens did. The first event of a burst schedules one drain on the loop; the others
    only join the queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque[tuple[Callable[[Any], None], Any]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def call(self, fn: Callable[[Any], None], item: Any) -> None:
        """From any thread: ``fn(item)`` on the loop."""
        with self._lock:
            self._items.append((fn, item))
            if self._scheduled:
                return
            self._scheduled = True
        self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items, self._scheduled = self._items, deque(), False
        for fn, item in items:
            fn(item)


@dataclass
class ServerState:
    engine: Engine
    model_name: str = MODEL_NAME
    _inbox: Inbox | None = None

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise RequestError(f"The model `{model}` does not exist.", "model", status=404)

    def inbox(self) -> Inbox:
        """The inbox of the running loop (the server runs one)."""
        loop = asyncio.get_running_loop()
        if self._inbox is None or self._inbox.loop is not loop:
            self._inbox = Inbox(loop)
        return self._inbox


class Routes:
    """Starlette routes from handlers ``async (request) -> Response | JSON value``."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def get(self, path: str) -> Any:
        return self._add(path, "GET")

    def post(self, path: str) -> Any:
        return self._add(path, "POST")

    def _add(self, path: str, method: str) -> Any:
        def register(handler: Any) -> Any:
            async def endpoint(request: Request) -> Response:
                out = await handler(request)
                return out if isinstance(out, Response) else JSONResponse(out)

            self.routes.append(Route(path, endpoint, methods=[method]))
            return handler

        return register


def error_response(message: str, status: int = 400, param: str | None = None) -> JSONResponse:
    kind = {404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}.get(
        status, "BadRequestError"
    )
    body = ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=status))
    return JSONResponse(body.model_dump(), status_code=status)


async def parse(request: Request, model: type[M]) -> M:
    """The body as ``model``; RequestError (400) on bad JSON, types or values."""
    raw = await request.body()
    try:
        data = json.loads(raw) if raw else {}
    except ValueError as e:
        raise RequestError(f"request body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise RequestError("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(x) for x in first["loc"]) if first.get("loc") else None
        raise RequestError(f"{e.error_count()} validation error(s): {summary(e)}", param) from e


def summary(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)


async def run(state: ServerState, requests: Sequence[GenRequest], *, stream: bool = False) -> AsyncIterator[Any]:
    """Submit ``requests``; yield ``(index, event)`` pairs until every one finished."""
    inbox, engine = state.inbox(), state.engine
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    handles: list[Handle] = []

    def sink(i: int) -> Any:
        return lambda ev: inbox.call(queue.put_nowait, (i, ev))

    try:
        for i, req in enumerate(requests):
            handles.append(engine.submit(req, sink(i), stream=stream))
        remaining = len(requests)
        while remaining:
            i, ev = await queue.get()
            if isinstance(ev, Exception):
                raise ev
            if isinstance(ev, GenResult):
                remaining -= 1
            yield i, ev
    finally:
        for h in handles:
            h.cancel()


class ClientGone(Exception):
    """The client disconnected before its answer was ready (its requests are aborted)."""


async def results(state: ServerState, requests: Sequence[GenRequest], request: Request) -> list[GenResult]:
    """The results of ``requests``; :class:`ClientGone` as soon as ``request``'s client
    disconnects, its requests cancelled right there (the engine drops them before its
    next step)."""
    inbox, engine, loop = state.inbox(), state.engine, asyncio.get_running_loop()
    answers: list[asyncio.Future[GenResult]] = [loop.create_future() for _ in requests]

    def deliver(item: tuple[asyncio.Future[GenResult], Any]) -> None:
        future, ev = item
        if future.done():
            return
        if isinstance(ev, Exception):
            future.set_exception(ev)
        elif isinstance(ev, GenResult):
            future.set_result(ev)

    def sink(future: asyncio.Future[GenResult]) -> Any:
        return lambda ev: inbox.call(deliver, (future, ev))

    handles: list[Handle] = []
    gone = asyncio.ensure_future(_disconnect(request))
    work = asyncio.gather(*answers)
    try:
        for req, future in zip(requests, answers, strict=True):
            handles.append(engine.submit(req, sink(future)))
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return list(work.result())
        for h in handles:
            h.cancel()
        raise ClientGone
    finally:
        for h in handles:
            h.cancel()
        for task in (work, gone):
            task.cancel()
        await asyncio.gather(work, gone, return_exceptions=True)


async def _disconnect(request: Request) -> None:
    """Return when the client goes away. The body has been read, so the next ASGI message
    is ``http.disconnect`` (the server sends it when the connection closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def token_str(t: int, as_id: bool = False) -> str:
    """The text of one token in log-prob listings (vLLM: ``token_id:<id>`` if asked)."""
    if as_id:
        return f"token_id:{t}"
    if t in _SPECIAL:
        return _SPECIAL[t]
    return bytes([t]).decode("utf-8", errors="replace") if 0 <= t < 256 else f"<{t}>"


def token_text(ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of ids; special tokens are dropped unless ``skip_special_tokens`` is false."""
    if skip_special_tokens:
        return bytes(t for t in ids if 0 <= t < 256).decode("utf-8", errors="replace")
    out: list[str] = []
    run_ = bytearray()
    for t in ids:
        if 0 <= t < 256:
            run_.append(t)
        else:
            out.append(run_.decode("utf-8", errors="replace"))
            run_ = bytearray()
            out.append(_SPECIAL.get(t, ""))
    out.append(run_.decode("utf-8", errors="replace"))
    return "".join(out)


class TextStream:
    """The text of one streamed answer, sent as it grows: complete UTF-8 characters only,
    and, as vLLM's detokenizer does, holding back the last ``max(len(stop)) - 1``
    characters (none when the stop string stays in the answer), which could still begin a
    stop string. The token that matches a stop string ends the request and is never
    pushed (:class:`~focus.tinylm.engine.TokenEvent`), so what was sent is always a prefix
    of the final, trimmed text and the deltas add up to it."""

    def __init__(self, stops: Sequence[str], skip_special_tokens: bool, include_stop: bool) -> None:
        self.skip_special_tokens, self.include_stop = skip_special_tokens, include_stop
        self.ids: list[int] = []
        self.data = bytearray()  # the byte tokens (special tokens have no bytes)
        self.sent = ""
        self.hold = 0 if include_stop else max((len(s) for s in stops), default=1) - 1

    def push(self, tok: int) -> str:
        """The text that token ``tok`` makes safe to send."""
        self.ids.append(tok)
        if 0 <= tok < 256:
            self.data.append(tok)
        if self.skip_special_tokens:
            text = self.data.decode("utf-8", errors="replace")
        else:
            text = token_text(self.ids, False)
        if (self.skip_special_tokens or 0 <= tok < 256) and _incomplete_utf8(bytes(self.data[-4:])):
            text = text[:-1]  # a partial character decodes as one replacement char
        text = text[: max(len(self.sent), len(text) - self.hold)]
        delta, self.sent = text[len(self.sent) :], max(text, self.sent, key=len)
        return delta

    def finish(self, res: GenResult) -> str:
        """The rest of the final text (the answer's, stop string trimmed)."""
        text = trim_stop(token_text(res.token_ids, self.skip_special_tokens), res, self.include_stop)
        delta = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent = text
        return delta


def _incomplete_utf8(data: bytes) -> bool:
    for k in range(1, min(4, len(data)) + 1):
        b = data[-k]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
            return need > k
    return False


def finite(x: float) -> float:
    """-inf (a token outside the truncation set) as vLLM writes it: -9999.0."""
    return max(x, -9999.0)


def stop_reason(res: GenResult) -> int | str | None:
    """vLLM's ``stop_reason``: the stop string or id; None for end-of-turn (EOS)."""
    return None if res.matched == ByteCodec.EOT else res.matched


def trim_stop(text: str, res: GenResult, include: bool) -> str:
    """Completion text ends before a matched stop string (after it if ``include``)."""
    if isinstance(res.matched, str) and res.matched:
        cut = text.find(res.matched)
        if cut >= 0:
            return text[: cut + (len(res.matched) if include else 0)]
    return text


def engine_error(e: EngineError) -> RequestError:
    return RequestError(str(e), "prompt")


__all__ = [
    "MODEL_NAME",
    "ClientGone",
    "ServerState",
    "TextStream",
    "TokenEvent",
    "error_response",
    "finite",
    "parse",
    "results",
    "run",
    "stop_reason",
    "summary",
    "token_str",
    "token_text",
    "trim_stop",
]
