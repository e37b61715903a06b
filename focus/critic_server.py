"""A critic served over HTTP, in the protocol :class:`focus.critic.HttpCritic` speaks.

Puts a locally trained critic behind the interface a remote scoring service has, and
gives the tests a real loopback server. Apart from :mod:`focus.critic`, which holds the
interface and the clients a collection builds, none of which serves."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from focus.critic import Critic, check_predictions


@contextmanager
def serve_critic(critic: Critic, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``critic`` over HTTP (the protocol :class:`HttpCritic` speaks) in a thread.

    Yields the URL. Used to put a locally trained critic behind the same interface a
    remote scoring service has, and by the tests as a real loopback server.
    """

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # silence per-request logs
            pass

        def _send(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"null")
                if not isinstance(body, list) or not all(
                    isinstance(c, list) and all(isinstance(t, int) for t in c) for c in body
                ):
                    self._send(400, {"error": "expected a JSON list of contexts, each a list of integer token ids"})
                    return
                where = f"critic {type(critic).__name__}"
                # checked and made floats here: a numpy float or a number without a std
                # broke the handler below, outside this try, and closed the connection
                preds = check_predictions(asyncio.run(critic.predict_with_std(body)), len(body), where)
            except json.JSONDecodeError as e:
                self._send(400, {"error": f"body is not JSON: {e.msg}"})
                return
            except Exception as e:  # noqa: BLE001 - report, keep serving
                self._send(500, {"error": f"{type(e).__name__}: {e}"})
                return
            stds = [p.std for p in preds]
            self._send(
                200, {"values": [p.value for p in preds], "stds": stds if all(s is not None for s in stds) else None}
            )

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="focus-critic-server", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}/score"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
