"""The wire: one request out, its whole answer back. Two senders behind one interface.

:class:`~focus.backends.http.HttpClient` decides what to send and what to do with the
answer (retries, hedges, outages, records); a :class:`Sender` only moves bytes:

* :class:`AiohttpSender`, the default: aiohttp's connection pool and parser, called
  directly. A collection keeps 64-256 calls in flight from one Python process, and the
  client's CPU per call is what stands between the engine and the model service; bare
  aiohttp is the cheapest stack measured (``python -m benchmarks.http_client``), and
  every object between the client and it costs CPU on every call (the ``httpx``
  request and response objects of ``httpx-aiohttp``'s transport cost about half of
  aiohttp's own time per call).
* :class:`HttpxSender`: any httpx transport (``httpx.MockTransport`` in unit tests, a
  proxying or instrumented ``httpx.AsyncHTTPTransport``), for ``transport=``: the code
  above the sender is the same for both, so tests with a mock transport exercise every
  line of the client but these few.

A sender is made for the event loop it runs on (its pool belongs to that loop) and
closed with it. Errors are the library's own (aiohttp's, httpx's, ``OSError``,
``TimeoutError``); the client classifies them.
"""

from __future__ import annotations

import abc
from typing import Any

import aiohttp
import httpx
from yarl import URL

#: How aiohttp's error begins where the request could not be written to its connection
#: (``ClientRequest.write_bytes``): nothing of it reached the server.
UNWRITTEN = "Can not write request body"

#: What a sender returns: the status, the whole body, and the ``Retry-After`` header of
#: a refusal (status >= 400) or the ``Location`` of a redirect (3xx), which no sender follows.
Answer = tuple[int, bytes, str | None]


class Sender(abc.ABC):
    """Sends one request and reads its whole answer."""

    @abc.abstractmethod
    def url(self, text: str) -> Any:
        """``text`` parsed into this sender's URL type (done once per path)."""

    @abc.abstractmethod
    async def send(self, method: str, url: Any, content: bytes | None, headers: dict[str, str]) -> Answer:
        """One request, the answer read to its end."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class AiohttpSender(Sender):
    """aiohttp's pool (``limit`` connections, no per-host cap), made on first use in the
    running loop; ``connect_timeout_s`` bounds opening a connection."""

    def __init__(self, limit: int, connect_timeout_s: float) -> None:
        self.limit, self.connect_timeout_s = limit, connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def url(self, text: str) -> URL:
        return URL(text)

    def _open(self) -> aiohttp.ClientSession:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.limit, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            skip_auto_headers=("User-Agent",),
        )
        return self._session

    async def send(self, method: str, url: Any, content: bytes | None, headers: dict[str, str]) -> Answer:
        """One request; sent once more, at once, on another connection when the pooled one
        it went out on was closed before the request could be written (aiohttp's "Can not
        write request body"): the server never read it. A server that closes each
        connection after its answer without ``Connection: close`` (an HTTP/1.1 server with
        keep-alive off, a proxy), or an idle timeout that meets the connection's reuse, made
        each call after the first fail so once, counted, backed off and retried as a
        ``connection`` failure. A connection closed or reset after the request was sent
        (the server may have read it) and one that cannot be opened are the client's to
        retry, as before."""
        session = self._session or self._open()
        try:
            return await self._send(session, method, url, content, headers)
        except aiohttp.ClientOSError as e:
            if isinstance(e, aiohttp.ClientConnectorError) or not str(e.strerror).startswith(UNWRITTEN):
                raise
        return await self._send(session, method, url, content, headers)

    @staticmethod
    async def _send(
        session: aiohttp.ClientSession, method: str, url: Any, content: bytes | None, headers: dict[str, str]
    ) -> Answer:
        # redirects not followed: aiohttp resends a POST redirected with 301, 302 or 303 as a GET
        # without its body (the server refused it, 405 or 404, naming no redirect); the client names it
        async with session.request(method, url, data=content, headers=headers, allow_redirects=False) as response:
            status = response.status
            said = None if status < 300 else response.headers.get("Retry-After" if status >= 400 else "Location")
            return status, await response.read(), said

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class HttpxSender(Sender):
    """Any httpx transport: ``httpx.Request`` in, ``httpx.Response`` read and closed."""

    def __init__(self, transport: httpx.AsyncBaseTransport, connect_timeout_s: float) -> None:
        self.transport = transport
        self._extensions = {"timeout": {"connect": connect_timeout_s}}

    def url(self, text: str) -> httpx.URL:
        return httpx.URL(text)

    async def send(self, method: str, url: Any, content: bytes | None, headers: dict[str, str]) -> Answer:
        request = httpx.Request(method, url, content=content, headers=headers, extensions=self._extensions)
        response = await self.transport.handle_async_request(request)
        try:
            data = await response.aread()
        finally:
            await response.aclose()
        status = response.status_code
        return (
            status,
            data,
            None if status < 300 else response.headers.get("retry-after" if status >= 400 else "location"),
        )

    async def aclose(self) -> None:
        await self.transport.aclose()
