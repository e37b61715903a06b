"""Transport shared by every HTTP policy backend: pooling, concurrency, retries.

A collection makes thousands of model calls; a few will meet an overloaded server
(429/503), a restart (closed connection), a timeout or a garbled answer. Those are
retried with exponential backoff and jitter; anything else (a 4xx saying the request
is wrong) fails at once. After the last try the caller gets one :class:`PolicyError`
naming the URL, the last status and the cause - and the Agent turns that into a
``failed`` leaf, so finished work is kept.

The httpx client and the semaphore belong to one event loop. Policies are pickled to
Dask workers and used from several ``asyncio.run`` calls, so both are created lazily
for the running loop and dropped when pickling.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field

from focus.policy import PolicyError

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
        self._client: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None
        #: Attempts that were retried, by cause, since creation (for stats and tests).
        self.retries: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_loop=None, _client=None, _sem=None, _transport=None)
        return state

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._sem is None or self._loop is not loop or self._client.is_closed:
            headers = dict(self.config.headers)
            if self.config.api_key:
                headers["Authorization"] = f"Bearer {self.config.api_key}"
            limits = httpx.Limits(
                max_connections=self.config.max_concurrency, max_keepalive_connections=self.config.max_concurrency
            )
            timeout = httpx.Timeout(self.config.timeout_s, connect=self.config.connect_timeout_s)
            self._client = httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout, transport=self._transport)
            self._sem = asyncio.Semaphore(self.config.max_concurrency)
            self._loop = loop
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
            try:
                resp = await client.request(method, url, json=body)
            except httpx.TimeoutException as e:
                raise _Retryable(None, f"timeout: {type(e).__name__} after {self.config.timeout_s:g} s") from e
            except httpx.TransportError as e:  # refused, reset, closed mid-answer
                raise _Retryable(None, f"connection: {type(e).__name__}: {e}") from e
        if resp.status_code in RETRY_STATUSES or resp.status_code >= 500:
            err = _Retryable(resp.status_code, f"server error: {_snippet(resp.text)}")
            ra = resp.headers.get("retry-after")
            if ra is not None:
                try:
                    err.retry_after = min(float(ra), self.config.backoff_max_s)  # type: ignore[attr-defined]
                except ValueError:
                    pass
            raise err
        if resp.status_code >= 400:
            raise PolicyError(f"{method} {url} was rejected with status {resp.status_code}: {_snippet(resp.text)}")
        try:
            data = json.loads(resp.content)
        except ValueError as e:
            raise _Retryable(resp.status_code, f"malformed response: not JSON ({e}): {_snippet(resp.text)}") from e
        try:
            return parse(data)
        except (MalformedResponse, PolicyError, KeyError, TypeError, IndexError, ValueError) as e:
            raise _Retryable(resp.status_code, f"malformed response: {type(e).__name__}: {e}") from e

    async def aclose(self) -> None:
        client, self._client, self._sem, self._loop = self._client, None, None, None
        if client is not None and not client.is_closed:
            try:
                await client.aclose()
            except RuntimeError:  # created on a loop that is gone; nothing left to release
                pass


def _snippet(text: str, n: int = 300) -> str:
    text = text.strip().replace("\n", " ")
    return text if len(text) <= n else text[:n] + "..."
