"""The served application: routes, error handling, health and Prometheus metrics.

:func:`create_app` mounts vLLM's OpenAI-compatible routes
(:mod:`focus.tinylm.routes_openai`) and SGLang's native ones
(:mod:`focus.tinylm.routes_sglang`) over one :class:`~focus.tinylm.engine.Engine`.
Every refusal is a 4xx in vLLM's error layout; an unexpected failure is a 500 in the
same layout, and the server keeps serving. ``/metrics`` uses vLLM's metric names, so
dashboards and autoscalers built for vLLM read it. Nothing here is for tests only:
fault injection lives in :mod:`focus.tinylm.testing`.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from focus.tinylm import routes_openai, routes_sglang
from focus.tinylm.engine import Engine, EngineError
from focus.tinylm.protocol import RequestError
from focus.tinylm.serving import MODEL_NAME, Routes, ServerState, error_response


def create_app(engine: Engine, *, model_name: str = MODEL_NAME) -> Starlette:
    state = ServerState(engine, model_name)
    own = Routes()

    async def _request_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError)
        return error_response(str(exc), exc.status, exc.param)

    async def _engine_error(request: Request, exc: Exception) -> Response:
        return error_response(str(exc), 400, "prompt")

    async def _http(request: Request, exc: Exception) -> Response:
        # an unknown path or method: vLLM's (fastapi's) JSON body, not Starlette's text
        assert isinstance(exc, HTTPException)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    async def _internal(request: Request, exc: Exception) -> Response:
        return error_response(f"{type(exc).__name__}: {exc}", 500)

    @own.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        return {"status": "ok", "policy_version": engine.policy_version}

    @own.get("/version")
    async def version(request: Request) -> dict[str, Any]:
        return {"version": "focus-tinylm", "policy_version": engine.policy_version}

    @own.get("/metrics")
    async def metrics(request: Request) -> Response:
        return PlainTextResponse(prometheus_text(engine, model_name))

    app = Starlette(
        routes=[*own.routes, *routes_openai.router(state), *routes_sglang.router(state)],
        exception_handlers={
            RequestError: _request_error,
            EngineError: _engine_error,
            HTTPException: _http,
            Exception: _internal,
        },
    )
    app.state.tinylm = state
    return app


def prometheus_text(engine: Engine, model_name: str) -> str:
    """vLLM's metrics of this engine, in Prometheus' text exposition format."""
    labels = f'engine="0",model_name="{model_name}"'
    lines: list[str] = []

    def metric(name: str, kind: str, doc: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {doc}")
        lines.append(f"# TYPE {name} {kind}")
        for extra, value in samples:
            lab = labels + (f",{extra}" if extra else "")
            suffix = "_total" if kind == "counter" else ""
            lines.append(f"{name}{suffix}{{{lab}}} {float(value)}")

    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        [("", engine.num_running)],
    )
    metric(
        "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [("", engine.num_waiting)]
    )
    metric("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", [("", engine.prompt_tokens)])
    metric(
        "vllm:generation_tokens", "counter", "Number of generation tokens processed.", [("", engine.generation_tokens)]
    )
    metric(
        "vllm:prefix_cache_queries",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        [("", engine.cache.queries)],
    )
    metric(
        "vllm:prefix_cache_hits",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        [("", engine.cache.hits)],
    )
    metric(
        "vllm:request_success",
        "counter",
        "Count of successfully processed requests.",
        [(f'finished_reason="{k}"', v) for k, v in sorted(engine.finished.items())] or [('finished_reason="stop"', 0)],
    )
    metric("vllm:kv_cache_usage_perc", "gauge", "Prefix cache usage (1 = full).", [("", engine.cache_usage)])
    return "\n".join(lines) + "\n"
