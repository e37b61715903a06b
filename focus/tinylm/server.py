"""HTTP server of the tiny model, speaking the subsets of the vLLM and SGLang APIs that
FOCUS backends use, so the same client code talks to it and to a real server.

Endpoints: ``POST /v1/completions`` (vLLM: token-id prompts, ``logprobs``,
``return_token_ids``, ``return_tokens_as_token_ids``), ``POST /generate`` (SGLang
native: ``input_ids``, ``sampling_params``, ``return_logprob``), ``GET /health``,
``GET /v1/models``, ``POST /tokenize``, ``POST /detokenize`` and
``POST /update_weights_from_disk`` (SGLang's name). Every answer carries the
``policy_version`` (a hash of the weights file) so batches can record it.

Generation runs in worker threads: the event loop keeps accepting requests while
the model computes. With ``--debug`` the server also records received prompts
(``GET /debug/requests``) and injects faults on request (``POST /debug/faults``:
error statuses, delays, malformed bodies, NaN log-probs), which is how the tests
exercise client retries against a real socket.

Run: ``python -m focus.tinylm.server --port 8000 [--weights PATH] [--debug]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from focus.format import ByteCodec
from focus.tinylm.engine import Engine, EngineError, GenRequest, GenResult

MODEL_NAME = "focus-tinylm"


class Faults:
    """Queued faults for the next requests to generation endpoints (debug mode only)."""

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


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": kind, "code": status}, status_code=status)


def _as_tuple(v: Any, name: str, item: type) -> tuple[Any, ...]:
    if v is None:
        return ()
    if isinstance(v, item):
        return (v,)
    if not isinstance(v, list) or not all(isinstance(x, item) and not isinstance(x, bool) for x in v):
        raise EngineError(f"'{name}' must be a {item.__name__} or a list of them")
    return tuple(v)


def create_app(engine: Engine, *, debug: bool = False, workers: int = 2) -> FastAPI:
    app = FastAPI(title="focus tinylm")
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tinylm")
    faults = Faults()
    received: deque[dict[str, Any]] = deque(maxlen=10000)

    async def run(req: GenRequest, endpoint: str) -> GenResult | Response:
        if debug:
            received.append({"endpoint": endpoint, "prompt_ids": list(req.prompt_ids), "t": time.time()})
            fault = faults.pop()
            if fault is not None:
                if fault.get("delay_s"):
                    await asyncio.sleep(float(fault["delay_s"]))
                if fault.get("status"):
                    return _error(int(fault["status"]), "injected fault", "InjectedFault")
                if fault.get("malformed"):
                    return PlainTextResponse('{"choices": [', media_type="application/json")
                if fault.get("nan_logprobs"):
                    result = await asyncio.get_running_loop().run_in_executor(pool, engine.generate, req)
                    return GenResult(
                        result.token_ids,
                        tuple(float("nan") for _ in result.logprobs),
                        result.finish_reason,
                        result.matched,
                        result.cached_tokens,
                        result.policy_version,
                    )
        return await asyncio.get_running_loop().run_in_executor(pool, engine.generate, req)

    async def body(request: Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except ValueError as e:
            raise EngineError(f"request body is not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise EngineError("request body must be a JSON object")
        return data

    def prompt_ids(value: Any, field: str) -> tuple[int, ...]:
        if isinstance(value, str):
            return tuple(engine.codec.encode_text(value))
        if isinstance(value, list) and value and isinstance(value[0], list):
            if len(value) != 1:
                raise EngineError(f"'{field}' holds {len(value)} prompts; this server takes one per request")
            value = value[0]
        return _as_tuple(value, field, int)

    @app.exception_handler(EngineError)
    async def _engine_error(request: Request, exc: EngineError) -> JSONResponse:
        return _error(400, str(exc))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "policy_version": engine.policy_version}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": MODEL_NAME,
            "object": "model",
            "owned_by": "focus",
            "max_model_len": engine.max_len,
            "vocab_size": engine.vocab_size,
            "policy_version": engine.policy_version,
            "root": engine.weights_path,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        data = await body(request)
        if int(data.get("n", 1)) != 1:
            raise EngineError("this server samples one completion per request (n=1)")
        if data.get("echo"):
            raise EngineError("echo is not supported")
        stop = data.get("stop")
        req = GenRequest(
            prompt_ids=prompt_ids(data.get("prompt"), "prompt"),
            max_tokens=int(data.get("max_tokens") or 16),
            temperature=float(data.get("temperature", 1.0)),
            top_p=float(data.get("top_p", 1.0)),
            stop=_as_tuple(stop, "stop", str),
            stop_token_ids=_as_tuple(data.get("stop_token_ids"), "stop_token_ids", int),
            seed=data.get("seed"),
            ignore_eos=bool(data.get("ignore_eos", False)),
        )
        res = await run(req, "/v1/completions")
        if isinstance(res, Response):
            return res
        choice: dict[str, Any] = {
            "index": 0,
            "text": engine.codec.decode(res.token_ids),
            "finish_reason": res.finish_reason,
            "stop_reason": res.matched if res.matched != ByteCodec.EOT else None,
            "logprobs": None,
        }
        if data.get("logprobs") is not None:
            as_ids = bool(data.get("return_tokens_as_token_ids"))
            tokens = [f"token_id:{t}" if as_ids else engine.codec.decode([t]) for t in res.token_ids]
            choice["logprobs"] = {
                "tokens": tokens,
                "token_logprobs": list(res.logprobs),
                "top_logprobs": [{tok: lp} for tok, lp in zip(tokens, res.logprobs, strict=True)],
                "text_offset": [],
            }
        if data.get("return_token_ids"):
            choice["token_ids"] = list(res.token_ids)
            choice["prompt_token_ids"] = list(req.prompt_ids)
        n_prompt = len(req.prompt_ids)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": MODEL_NAME,
            "choices": [choice],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": len(res.token_ids),
                "total_tokens": n_prompt + len(res.token_ids),
                "prompt_tokens_details": {"cached_tokens": res.cached_tokens},
            },
            "policy_version": res.policy_version,
        }

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        data = await body(request)
        sp = data.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise EngineError("'sampling_params' must be an object")
        ids = data.get("input_ids") if data.get("input_ids") is not None else data.get("text")
        req = GenRequest(
            prompt_ids=prompt_ids(ids, "input_ids"),
            max_tokens=int(sp.get("max_new_tokens") or 128),
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            stop=_as_tuple(sp.get("stop"), "stop", str),
            stop_token_ids=_as_tuple(sp.get("stop_token_ids"), "stop_token_ids", int),
            seed=sp.get("sampling_seed"),
            ignore_eos=bool(sp.get("ignore_eos", False)),
        )
        res = await run(req, "/generate")
        if isinstance(res, Response):
            return res
        if res.finish_reason == "stop":
            finish: dict[str, Any] = {"type": "stop", "matched": res.matched}
        else:
            finish = {"type": "length", "length": len(res.token_ids)}
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(req.prompt_ids),
            "completion_tokens": len(res.token_ids),
            "cached_tokens": res.cached_tokens,
            "policy_version": res.policy_version,
        }
        if data.get("return_logprob"):
            meta["output_token_logprobs"] = [[lp, t, None] for t, lp in zip(res.token_ids, res.logprobs, strict=True)]
        return {"text": engine.codec.decode(res.token_ids), "output_ids": list(res.token_ids), "meta_info": meta}

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        data = await body(request)
        text = data.get("prompt", data.get("text"))
        if not isinstance(text, str):
            raise EngineError("'prompt' must be a string")
        ids = engine.codec.encode_text(text)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.max_len}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        data = await body(request)
        ids = _as_tuple(data.get("tokens"), "tokens", int)
        bad = [t for t in ids if not 0 <= t < engine.vocab_size]
        if bad:
            raise EngineError(f"token ids {bad[:5]} are outside the vocabulary [0, {engine.vocab_size})")
        return {"prompt": engine.codec.decode(ids)}

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> Any:
        data = await body(request)
        path = data.get("model_path")
        if not isinstance(path, str) or not path:
            raise EngineError("'model_path' must name a weights file")
        try:
            version = await asyncio.get_running_loop().run_in_executor(pool, engine.reload, path)
        except (FileNotFoundError, ValueError) as e:
            return JSONResponse({"success": False, "message": str(e), "policy_version": engine.policy_version}, 400)
        return {"success": True, "message": f"loaded {path}", "policy_version": version}

    if debug:

        @app.get("/debug/requests")
        async def debug_requests() -> dict[str, Any]:
            return {"requests": list(received)}

        @app.delete("/debug/requests")
        async def debug_clear() -> dict[str, Any]:
            received.clear()
            return {"cleared": True}

        @app.post("/debug/faults")
        async def debug_faults(request: Request) -> dict[str, Any]:
            spec = await body(request)
            faults.push(spec)
            return {"queued": len(faults.queue)}

    return app


def _watch_parent(pid: int) -> None:
    """Exit when the process that started us is gone, so a crashed test leaks nothing."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(0)


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description="Serve the focus tiny model over HTTP.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (see --port-file)")
    ap.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    ap.add_argument("--weights", help="weights file (default: the committed initial weights)")
    ap.add_argument("--workers", type=int, default=2, help="generation threads")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--debug", action="store_true", help="record prompts and accept fault injection")
    ap.add_argument("--parent-pid", type=int, help="exit when this process exits")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.torch_threads)
    engine = Engine(args.weights)
    app = create_app(engine, debug=args.debug, workers=args.workers)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if args.port_file and server.started:
            tmp = args.port_file.with_suffix(".tmp")
            tmp.write_text(str(port))
            tmp.replace(args.port_file)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
