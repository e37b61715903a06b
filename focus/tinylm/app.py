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
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from focus.tinylm import routes_openai, routes_sglang
from focus.tinylm.engine import Engine, EngineError
from focus.tinylm.protocol import RequestError
from focus.tinylm.serving import ENGINE_STALL_S, MODEL_NAME, ClientGone, Routes, ServerState, error_response


def create_app(engine: Engine, *, model_name: str = MODEL_NAME, engine_stall_s: float = ENGINE_STALL_S) -> Starlette:
    """The app over ``engine``. ``/health`` is answered by the web loop but speaks for the
    engine: 503 (``"engine stalled"``) once one step of it has run longer than
    ``engine_stall_s`` (a step is one token of every running sequence, milliseconds here;
    a long generation is many), as vLLM answers 503 for a dead engine; both answers carry
    ``engine_step_s``, which :class:`focus.backends.local.LocalModelServer`'s keeper reads.
    It answered 200 from the loop while the engine was stuck."""
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

    async def _gone(request: Request, exc: Exception) -> Response:
        return Response(status_code=499)  # nobody reads it (nginx's "client closed request")

    async def _internal(request: Request, exc: Exception) -> Response:
        return error_response(f"{type(exc).__name__}: {exc}", 500)

    @own.get("/health")
    async def health(request: Request) -> Any:
        step = engine.step_s()
        body = {"status": "ok", "policy_version": engine.policy_version, "engine_step_s": round(step, 3)}
        if step > engine_stall_s:
            return JSONResponse({**body, "status": "engine stalled"}, status_code=503)
        return body

    @own.get("/version")
    async def version(request: Request) -> dict[str, Any]:
        return {"version": "focus-tinylm", "policy_version": engine.policy_version}

    @own.get("/metrics")
    async def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(prometheus_text(engine, model_name), media_type=CONTENT_TYPE_LATEST)

    app = Starlette(
        routes=[*own.routes, *routes_openai.router(state), *routes_sglang.router(state)],
        exception_handlers={
            RequestError: _request_error,
            EngineError: _engine_error,
            HTTPException: _http,
            ClientGone: _gone,
            ClientDisconnect: _gone,
            Exception: _internal,
        },
    )
    app.state.tinylm = state
    return app


class _EngineMetrics:
    """A prometheus_client collector of the engine's counters and gauges, read at each
    scrape (the engine keeps the numbers; the library writes the page, so counters are
    declared as Prometheus' parser expects: ``vllm:prompt_tokens`` typed counter, its
    sample ``vllm:prompt_tokens_total``)."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine, self.labels = engine, {"engine": "0", "model_name": model_name}

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        e, names, values = self.engine, list(self.labels), list(self.labels.values())

        def gauge(name: str, doc: str, value: float) -> Any:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> Any:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", e.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.num_waiting)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", e.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", e.generation_tokens)
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", e.cache.queries
        )
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", e.cache.hits)
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*names, "finished_reason"]
        )
        for reason, n in sorted({"stop": 0, **e.finished}.items()):
            success.add_metric([*values, reason], n)
        yield success
        yield gauge("vllm:kv_cache_usage_perc", "Prefix cache usage (1 = full).", e.cache_usage)


def prometheus_text(engine: Engine, model_name: str) -> bytes:
    """vLLM's metrics of this engine, in Prometheus' text exposition format."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineMetrics(engine, model_name))
    return generate_latest(registry)
