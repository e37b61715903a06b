"""An HTTP proxy in front of an S3-compatible server that answers as a throttled or
failing object store does: ``503 SlowDown`` or ``500 InternalError`` for a while, or as
the things between an operator and the store do: a gateway's ``502``/``504`` page with
no S3 error code, MinIO's own codes, credentials that expire (``400 ExpiredToken``,
which S3 answers to a ``HEAD`` without a body), a bucket deleted (``404 NoSuchBucket``).

:class:`focus.testing.faults.TcpRelay` cuts connections (an endpoint gone); this one
keeps answering, with the errors S3 sends under load, which s3fs turns into other
exceptions (``EBUSY``, ``EREMOTEIO``) than a refused connection. Requests it does not
fail are forwarded unchanged (signed headers included), so any client that talks to
the upstream talks to it: point ``endpoint_url`` (or ``AWS_ENDPOINT_URL``) at :attr:`url`.
Standard library only; loopback only.
"""

from __future__ import annotations

import http.client
import http.server
import threading
import time
from typing import Any
from urllib.parse import unquote, urlsplit

#: The answers of a throttled (503) and a failing (500) S3 service, as AWS words them,
#: and the other statuses :meth:`S3FaultProxy.fail` sends (its ``code`` names another).
ERRORS = {
    503: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    400: ("ExpiredToken", "The provided token has expired."),
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchBucket", "The specified bucket does not exist"),
    429: ("SlowDown", "Please reduce your request rate."),
    502: ("BadGateway", "Bad Gateway"),
    504: ("GatewayTimeout", "Gateway Timeout"),
    501: ("NotImplemented", "A header you provided implies functionality that is not implemented."),
}
#: Hop-by-hop headers and those the proxy sets itself.
_SKIP = {"host", "content-length", "transfer-encoding", "connection", "expect", "keep-alive"}


class S3FaultProxy:
    """``with S3FaultProxy("http://127.0.0.1:9000") as proxy: proxy.fail(503, for_s=2)``.

    :meth:`fail` answers every request with ``status`` (one of :data:`ERRORS`) until
    :meth:`restore` or for ``for_s`` seconds from the first request it answers (not from
    the call: a client whose first request comes late, on a loaded machine, still meets
    the whole fault); :attr:`failed` counts the requests so
    answered. ``code`` replaces the status's S3 error code, ``html=True`` sends a
    gateway's HTML page instead (no code at all), ``methods`` limits the fault to those
    requests (``{"PUT"}``: writes), ``from_path`` holds the fault back until the first
    request whose path contains it (a fault that starts at a chosen step, whatever the
    number of requests before it). :attr:`delay_s` holds every forwarded request that
    long (a slow store). :attr:`served` lists every forwarded request as ``(start, end,
    method, path)`` (``time.monotonic``; the path unquoted, the query string cut; ``end``
    when the store answered, recorded before the answer goes back, so a client holding
    its answer finds its request listed), for a count of requests and of how many were
    in flight at once (:func:`peak_in_flight`).
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._status: int | None = None
        self._code: str | None = None
        self._html = False
        self._methods: frozenset[str] | None = None
        self._from_path: str | None = None
        self._until = float("inf")
        self._for_s: float | None = None
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self.failed = 0
        self.served: list[tuple[float, float, str, str]] = []
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the proxy first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(
        self,
        status: int = 503,
        *,
        for_s: float | None = None,
        code: str | None = None,
        html: bool = False,
        methods: set[str] | None = None,
        from_path: str | None = None,
    ) -> None:
        if status not in ERRORS:
            raise ValueError(f"status {status}: one of {sorted(ERRORS)}")
        with self._lock:
            self._status, self._code, self._html = status, code, html
            self._methods = frozenset(m.upper() for m in methods) if methods else None
            self._from_path = from_path
            self._until = float("inf")
            self._for_s = for_s  # the window opens at the first request answered with the fault

    def restore(self) -> None:
        with self._lock:
            self._status = None

    def _fault(self, method: str, path: str) -> tuple[int, bytes, str] | None:
        """(status, body, content type) of the fault for a ``method`` request, if any."""
        with self._lock:
            if self._status is not None and time.monotonic() >= self._until:
                self._status = None
            if self._from_path is not None:
                if self._from_path not in unquote(path):
                    return None
                self._from_path = None  # armed from here on
            if self._status is None or (self._methods is not None and method not in self._methods):
                return None
            if self._for_s is not None:
                self._until, self._for_s = time.monotonic() + self._for_s, None
            self.failed += 1
            code, message = ERRORS[self._status]
            if self._html:
                page = f"<html><body><h1>{self._status} {message}</h1></body></html>"
                return self._status, page.encode(), "text/html"
            data = (
                '<?xml version="1.0" encoding="UTF-8"?>'
                f"<Error><Code>{self._code or code}</Code><Message>{message}</Message></Error>"
            )
            return self._status, data.encode(), "application/xml"

    def start(self) -> S3FaultProxy:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                fault = proxy._fault(self.command, self.path)
                if fault is not None:
                    status, data, kind = fault  # a HEAD answer carries no body: S3 names no code then
                    self._reply(status, [("Content-Type", kind)], data, len(data))
                    return
                start = time.monotonic()
                if proxy.delay_s:
                    time.sleep(proxy.delay_s)
                conn = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                recorded = False

                def record() -> None:  # before the reply: a client that has its answer finds it in ``served``
                    nonlocal recorded
                    recorded = True
                    with proxy._lock:
                        proxy.served.append((start, time.monotonic(), self.command, unquote(self.path.split("?")[0])))

                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _SKIP}
                    conn.request(self.command, self.path, body=body if size else None, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                    length = int(answer.headers.get("Content-Length") or len(data))
                    kept = [(k, v) for k, v in answer.getheaders() if k.lower() not in _SKIP]
                    record()
                    self._reply(answer.status, kept, data, length)
                finally:
                    conn.close()
                    if not recorded:  # the store upstream failed: the request is still one that came
                        record()

            def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes, length: int) -> None:
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                # a HEAD answer states the object's length and carries no body
                self.send_header("Content-Length", str(length if self.command == "HEAD" else len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> S3FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def peak_in_flight(served: list[tuple[float, float, str, str]]) -> int:
    """The most of ``served`` (:attr:`S3FaultProxy.served` records) in flight at one time."""
    events = sorted([(t0, 1) for t0, _, _, _ in served] + [(t1, -1) for _, t1, _, _ in served])
    peak = now = 0
    for _, step in events:  # at a tie an end comes first: back-to-back requests do not overlap
        now += step
        peak = max(peak, now)
    return peak
