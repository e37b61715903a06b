"""Transport shared by every HTTP policy backend: pooling, concurrency, retries.

A collection makes thousands of model calls; a few will meet an overloaded server
(429/503), a restart (closed connection), a timeout or a garbled answer. Those are
retried with exponential backoff and jitter; anything else (a 4xx saying the request
is wrong) fails at once. After the last try the caller gets one :class:`PolicyError`
naming the URL, the last status and the cause - and the Agent turns that into a
``failed`` leaf, so finished work is kept.

Requests go through aiohttp by default: a collection keeps 100+ calls in flight from
one process, and httpx's pure-Python pool and h11 parser cost 2-9 ms of CPU per call at
that concurrency against aiohttp's ~0.3 ms (measured in benchmarks/engine.py), which
would make the engine, not the model service, the bottleneck. An explicit httpx
``transport`` (mocks, proxies, instrumentation in tests) selects the httpx path; both
paths share retry, status and parsing rules.

The client session and the semaphore belong to one event loop. Policies are pickled to
Dask workers and used from several ``asyncio.run`` calls, so both are created lazily
for the running loop and dropped when pickling.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

import aiohttp
import httpx
from pydantic import BaseModel, ConfigDict, Field

from focus.policy import Completion, Policy, PolicyError, SamplingParams

T = TypeVar("T")

RETRY_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class HttpConfig(BaseModel):
    """Timeouts, retries and concurrency of one backend's HTTP client."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Seconds to wait for one answer (read); a long generation needs a long timeout.
    timeout_s: float = Field(120.0, gt=0)
    connect_timeout_s: float = Field(5.0, gt=0)
    #: Retries after the first try (so ``max_retries + 1`` attempts at most).
    max_retries: int = Field(4, ge=0)
    #: First backoff in seconds; doubles each retry, capped at ``backoff_max_s``.
    backoff_s: float = Field(0.5, ge=0)
    backoff_max_s: float = Field(10.0, ge=0)
    #: Random extra wait, as a fraction of the backoff, so clients do not retry in lockstep.
    jitter: float = Field(0.5, ge=0)
    #: Requests in flight at once from this client (per event loop).
    max_concurrency: int = Field(64, gt=0)
    headers: dict[str, str] = Field(default_factory=dict)
    api_key: str | None = None


class MalformedResponse(ValueError):
    """The server answered 2xx but the body is not what the API promises; retried."""


class _Retryable(Exception):
    def __init__(self, status: int | None, cause: str) -> None:
        super().__init__(cause)
        self.status, self.cause = status, cause


class HttpClient:
    """JSON over HTTP with retries; one per backend instance, safe to pickle."""

    def __init__(
        self, base_url: str, config: HttpConfig | None = None, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.config = config or HttpConfig()
        self._transport = transport
        self._rng = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: aiohttp.ClientSession, or httpx.AsyncClient when a transport is given.
        self._client: Any = None
        self._sem: asyncio.Semaphore | None = None
        #: Attempts that were retried, by cause, since creation (for stats and tests).
        self.retries: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_loop=None, _client=None, _sem=None, _transport=None)
        return state

    def _headers(self) -> dict[str, str]:
        headers = dict(self.config.headers)
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def _session(self) -> tuple[Any, asyncio.Semaphore]:
        """The client of the running loop: an aiohttp session, or httpx over ``_transport``."""
        loop = asyncio.get_running_loop()
        client = self._client
        closed = client is None or (client.is_closed if isinstance(client, httpx.AsyncClient) else client.closed)
        if closed or self._sem is None or self._loop is not loop:
            n = self.config.max_concurrency
            if self._transport is not None:
                limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
                timeout = httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
                self._client = httpx.AsyncClient(
                    headers=self._headers(), limits=limits, timeout=timeout, transport=self._transport
                )
            else:
                self._client = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=n, limit_per_host=0),
                    timeout=aiohttp.ClientTimeout(
                        total=None, sock_connect=self.config.connect_timeout_s, sock_read=self.config.timeout_s
                    ),
                    headers=self._headers(),
                    skip_auto_headers=("User-Agent",),
                )
            self._sem = asyncio.Semaphore(n)
            self._loop = loop
        assert self._sem is not None
        return self._client, self._sem

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        base = min(self.config.backoff_max_s, self.config.backoff_s * 2**attempt)
        wait = base * (1 + self.config.jitter * self._rng.random())
        return max(wait, retry_after or 0.0)

    async def request(self, method: str, path: str, body: Any | None, parse: Callable[[Any], T]) -> T:
        """Send, decode JSON, ``parse`` it; retry transient failures; raise PolicyError."""
        url = f"{self.base_url}{path}"
        attempts = self.config.max_retries + 1
        last = _Retryable(None, "not sent")
        for attempt in range(attempts):
            retry_after = None
            try:
                return await self._once(method, url, body, parse)
            except _Retryable as e:
                last = e
                retry_after = getattr(e, "retry_after", None)
            self.retries[last.cause.split(":")[0]] = self.retries.get(last.cause.split(":")[0], 0) + 1
            if attempt + 1 < attempts:
                await asyncio.sleep(self.backoff(attempt, retry_after))
        status = f"status {last.status}" if last.status is not None else "no status"
        raise PolicyError(f"{method} {url} failed after {attempts} attempt(s); last: {status}: {last.cause}")

    async def _once(self, method: str, url: str, body: Any | None, parse: Callable[[Any], T]) -> T:
        client, sem = self._session()
        async with sem:
            if isinstance(client, httpx.AsyncClient):
                status, content, retry_after = await self._send_httpx(client, method, url, body)
            else:
                status, content, retry_after = await self._send_aiohttp(client, method, url, body)
        if status in RETRY_STATUSES or status >= 500:
            err = _Retryable(status, f"server error: {_snippet(_text(content))}")
            if retry_after is not None:
                try:
                    err.retry_after = min(float(retry_after), self.config.backoff_max_s)  # type: ignore[attr-defined]
                except ValueError:
                    pass
            raise err
        if status >= 400:
            raise PolicyError(f"{method} {url} was rejected with status {status}: {_snippet(_text(content))}")
        try:
            data = json.loads(content)
        except ValueError as e:
            raise _Retryable(status, f"malformed response: not JSON ({e}): {_snippet(_text(content))}") from e
        try:
            return parse(data)
        except (MalformedResponse, PolicyError, KeyError, TypeError, IndexError, ValueError) as e:
            raise _Retryable(status, f"malformed response: {type(e).__name__}: {e}") from e

    async def _send_aiohttp(
        self, session: aiohttp.ClientSession, method: str, url: str, body: Any | None
    ) -> tuple[int, bytes, str | None]:
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = None if body is None else _JSON_HEADERS
        try:
            async with session.request(method, url, data=data, headers=headers) as resp:
                return resp.status, await resp.read(), resp.headers.get("retry-after")
        except (TimeoutError, aiohttp.ServerTimeoutError) as e:
            raise _Retryable(None, f"timeout: {type(e).__name__} after {self.config.timeout_s:g} s") from e
        except aiohttp.ClientError as e:  # refused, reset, closed mid-answer
            raise _Retryable(None, f"connection: {type(e).__name__}: {e}") from e

    async def _send_httpx(
        self, client: httpx.AsyncClient, method: str, url: str, body: Any | None
    ) -> tuple[int, bytes, str | None]:
        try:
            resp = await client.request(method, url, json=body)
        except httpx.TimeoutException as e:
            raise _Retryable(None, f"timeout: {type(e).__name__} after {self.config.timeout_s:g} s") from e
        except httpx.TransportError as e:  # refused, reset, closed mid-answer
            raise _Retryable(None, f"connection: {type(e).__name__}: {e}") from e
        return resp.status_code, resp.content, resp.headers.get("retry-after")

    async def aclose(self) -> None:
        client, self._client, self._sem, self._loop = self._client, None, None, None
        if client is None:
            return
        try:
            if isinstance(client, httpx.AsyncClient):
                if not client.is_closed:
                    await client.aclose()
            elif not client.closed:
                await client.close()
        except RuntimeError:  # created on a loop that is gone; nothing left to release
            pass


_JSON_HEADERS = {"Content-Type": "application/json"}


class HttpPolicy(Policy):
    """A policy behind one HTTP endpoint of a model server.

    Subclasses name the endpoint (``path``), build the request (:meth:`request_body`)
    and parse the answer (:meth:`parse`, raising :class:`MalformedResponse` on an answer
    that cannot be trusted, and setting the completion's ``policy_version`` to the
    version the server reports); sending with retries, following that version and
    closing the connections are the same for every server.
    """

    path: ClassVar[str]
    http: HttpClient

    @property
    def url(self) -> str:
        return f"{self.http.base_url}{self.path}"

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, data: Any) -> Completion:
        raise NotImplementedError

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.check_prompt(prompt_ids)
        completion = await self.http.request("POST", self.path, self.request_body(prompt_ids, params), self.parse)
        if completion.policy_version:
            self.policy_version = completion.policy_version
        return completion

    async def aclose(self) -> None:
        await self.http.aclose()


def _text(content: bytes) -> str:
    return content.decode("utf-8", errors="replace")


def _snippet(text: str, n: int = 300) -> str:
    text = text.strip().replace("\n", " ")
    return text if len(text) <= n else text[:n] + "..."
